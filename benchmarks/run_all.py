"""Every benchmark behind docs/performance.md, in one command, with Lightning and Accelerate beside.

Runs each benchmark in its own process (the 2-process ones under torchrun), one after the other,
with the settings the figures in docs/performance.md were taken with, writes each one's JSON and
printed report into ``--out``, and prints the reports as they come. Lightning and Accelerate
run inside the same benchmarks when installed (``pip install -e '.[dev]'``), so every ratio has
theirs beside it, measured in the same rounds.

    python benchmarks/run_all.py --out results     # everything (about 15 minutes on 2 cores)
    python benchmarks/run_all.py --only overhead checkpoint
    python benchmarks/run_all.py --quick           # the smallest settings: checks that all run

``gpu`` prints that it skipped when CUDA is not available. The exit status is 1 when a
benchmark failed (the others still run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")

# name -> (command before the options, full options, quick options); "{json}" is the JSON path.
BENCHMARKS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "overhead": (
        (sys.executable, "-m", "benchmarks.bench_overhead"),
        ("--steps", "2000", "--rounds", "7"),
        ("--steps", "20", "--rounds", "1"),
    ),
    "loggers": (
        (sys.executable, "-m", "benchmarks.bench_loggers"),
        ("--steps", "2000", "--rounds", "5"),
        ("--steps", "100", "--rounds", "1"),
    ),
    "import": (
        (sys.executable, "-m", "benchmarks.bench_import"),
        ("--runs", "7"),
        ("--runs", "1"),
    ),
    "checkpoint": (
        (sys.executable, "-m", "benchmarks.bench_checkpoint"),
        ("--params", "100e6", "--rounds", "7"),
        ("--params", "1e6", "--rounds", "1"),
    ),
    "checkpoint_fsdp": (
        (*TORCHRUN, "benchmarks/bench_checkpoint_fsdp.py"),
        ("--params", "100e6", "--rounds", "5"),
        ("--params", "1e6", "--rounds", "1"),
    ),
    "async_checkpoint": (
        (sys.executable, "-m", "benchmarks.bench_async_checkpoint"),
        ("--params", "100e6", "--steps", "60", "--rounds", "2"),
        ("--params", "1e6", "--steps", "6", "--every", "2", "--rounds", "1"),
    ),
    "distributed": (
        (*TORCHRUN, "benchmarks/bench_distributed.py", "throughput"),
        ("--steps", "150", "--rounds", "3"),
        ("--steps", "10", "--rounds", "1"),
    ),
    "memory_ddp": (
        (*TORCHRUN, "benchmarks/bench_distributed.py", "memory", "--engine", "ddp"),
        (),
        ("--width", "256", "--depth", "2"),
    ),
    "memory_fsdp": (
        (*TORCHRUN, "benchmarks/bench_distributed.py", "memory", "--engine", "fsdp"),
        (),
        ("--width", "256", "--depth", "2"),
    ),
    "launch": (
        (sys.executable, "-m", "benchmarks.bench_launch"),
        ("--rounds", "5"),
        ("--rounds", "1", "--no-warmup"),
    ),
    "gpu": (
        (sys.executable, "-m", "benchmarks.bench_gpu"),
        ("--steps", "200", "--rounds", "5"),
        ("--steps", "5", "--warmup", "2", "--rounds", "1"),
    ),
}
# Freed all-gather buffers must go back to the OS, or FSDP's peak RSS measures glibc's heap.
ENV = {name: {"MALLOC_MMAP_THRESHOLD_": "1048576"} for name in ("memory_ddp", "memory_fsdp")}
HAS_JSON = {
    "overhead",
    "loggers",
    "import",
    "checkpoint",
    "checkpoint_fsdp",
    "async_checkpoint",
    "launch",
    "gpu",
}


def command_of(name: str, *, is_quick: bool, out: Path) -> list[str]:
    """The command line that runs benchmark ``name``, its JSON written under ``out``."""
    prefix, full, quick = BENCHMARKS[name]
    command = [*prefix, *(quick if is_quick else full)]
    if name in HAS_JSON:
        command += ["--json", str(out / f"{name}.json")]
    return command


def run_one(name: str, *, is_quick: bool, out: Path) -> bool:
    """Run one benchmark; print and save its report. Whether it exited with status 0."""
    command = command_of(name, is_quick=is_quick, out=out)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **ENV.get(name, {}),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    print(f"\n## {name}\n\n$ {' '.join(command)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    report = done.stdout + (f"\n[stderr]\n{done.stderr[-3000:]}" if done.returncode else "")
    (out / f"{name}.md").write_text(report, encoding="utf-8")
    print(report.rstrip(), flush=True)
    print(
        f"\n({name}: {time.perf_counter() - start:.0f} s, exit status {done.returncode})",
        flush=True,
    )
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=tuple(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="smallest settings (a smoke run)")
    parser.add_argument("--out", default=None, help="folder for reports and JSON (default: new)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="trainer-benchmarks-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"# trainer benchmarks ({os.cpu_count()} CPUs, load average {load} at the start)")
    failed = [name for name in args.only if not run_one(name, is_quick=args.quick, out=out)]
    print(f"\nReports and JSON in {out}." + (f" Failed: {', '.join(failed)}." if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
