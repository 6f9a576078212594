"""What ``import trainer`` costs on top of ``import torch``, and which optional packages it loads.

This script owns the import-time measurement and its report; it asserts nothing. It times fresh
interpreters from the outside (``time.perf_counter()`` around ``subprocess.run``):

- ``python -c "import torch"`` and ``python -c "import torch, trainer"``, interleaved, ``--runs``
  times each (7 by default) after one untimed run of each; the figure is the difference of the
  medians (the median of the paired differences is reported too). The children's CPU time
  (user + system, from ``getrusage``) is reported beside it: on a shared machine the wall time of
  a 1-3 s import wanders by up to a second, the CPU time much less;
- ``import trainer`` alone, timed inside an interpreter that has already imported torch;
- which of the optional packages (rich, torchmetrics, yaml, ...) are in ``sys.modules`` after
  ``import torch`` and after ``import trainer``.

The 0.15 s target is checked against each of the three measures (wall, CPU, in-process).

By default the children write and read bytecode under a temporary ``PYTHONPYCACHEPREFIX``
(``PYTHONDONTWRITEBYTECODE`` removed), as an installed package would have its ``.pyc`` files;
nothing is written into the source tree. ``--as-configured`` runs them with the environment
unchanged (with ``PYTHONDONTWRITEBYTECODE=1``, each run compiles trainer's sources again).

Run: ``python -m benchmarks.bench_import --runs 7 --json import.json``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

try:
    import resource
except ImportError:  # Windows has no `resource`: CPU times are then reported as 0
    resource = None  # type: ignore[assignment]  # reason: optional stdlib module

__all__ = ["OPTIONAL_MODULES", "main", "run_benchmark"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_DELTA_S = 0.15
OPTIONAL_MODULES = (
    "rich",
    "torchmetrics",
    "yaml",
    "tensorboard",
    "wandb",
    "mlflow",
    "deepspeed",
    "jsonargparse",
    "safetensors",
    "torch._dynamo",  # ~1 s; torch 2.13 loads it at the first optimizer, never at import
)
_TORCH_ONLY = "import torch"
_WITH_TRAINER = "import torch, trainer"
_IN_PROCESS = (
    "import time, torch\n"
    "start = time.perf_counter()\n"
    "import trainer\n"
    "print(time.perf_counter() - start)\n"
)
_MODULES_SCRIPT = """
import json, sys
import torch
after_torch = set(sys.modules)
import trainer
added = sorted(set(sys.modules) - after_torch)
names = {names!r}
print(json.dumps({{
    "by_torch": [m for m in names if m in after_torch],
    "by_trainer": [m for m in names if m in added],
    "added_count": len(added),
    "added_outside_trainer": sorted({{m.split(".")[0] for m in added}} - {{"trainer"}}),
}}))
"""


def _child_env(pycache_dir: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if pycache_dir is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache_dir
    return env


def _children_cpu_s() -> float:
    """User + system CPU seconds of finished children (0 where ``resource`` is missing)."""
    if resource is None:
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_python(code: str, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``python -c code`` in a fresh interpreter, and its stdout."""
    cpu_start = _children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    cpu = _children_cpu_s() - cpu_start
    if done.returncode != 0:
        raise RuntimeError(f"python -c {code!r} failed ({done.returncode}):\n{done.stderr}")
    return elapsed, cpu, done.stdout


def _measure(runs: int, env: dict[str, str]) -> dict[str, Any]:
    for code in (_TORCH_ONLY, _WITH_TRAINER, _IN_PROCESS):  # untimed: bytecode and file caches
        _run_python(code, env)
    torch_s: list[float] = []
    trainer_s: list[float] = []
    torch_cpu_s: list[float] = []
    trainer_cpu_s: list[float] = []
    in_process_s: list[float] = []
    for _ in range(runs):
        wall, cpu, _ = _run_python(_TORCH_ONLY, env)
        torch_s.append(wall)
        torch_cpu_s.append(cpu)
        wall, cpu, _ = _run_python(_WITH_TRAINER, env)
        trainer_s.append(wall)
        trainer_cpu_s.append(cpu)
        in_process_s.append(float(_run_python(_IN_PROCESS, env)[2]))
    delta = statistics.median(trainer_s) - statistics.median(torch_s)
    cpu_delta = statistics.median(trainer_cpu_s) - statistics.median(torch_cpu_s)
    return {
        "cpu_import_torch_s": torch_cpu_s,
        "cpu_import_torch_trainer_s": trainer_cpu_s,
        "cpu_delta_median_s": cpu_delta,
        "import_torch_s": torch_s,
        "import_torch_trainer_s": trainer_s,
        "import_torch_median_s": statistics.median(torch_s),
        "import_torch_trainer_median_s": statistics.median(trainer_s),
        "delta_median_s": delta,
        "delta_paired_median_s": statistics.median(b - a for a, b in zip(torch_s, trainer_s)),
        "import_trainer_in_process_s": in_process_s,
        "import_trainer_in_process_median_s": statistics.median(in_process_s),
        "target_delta_s": TARGET_DELTA_S,
        "target_met": {
            "wall": delta <= TARGET_DELTA_S,
            "cpu": cpu_delta <= TARGET_DELTA_S,
            "in_process": statistics.median(in_process_s) <= TARGET_DELTA_S,
        },
    }


def run_benchmark(*, runs: int, as_configured: bool = False) -> dict[str, Any]:
    """Time the imports ``runs`` times each and list the optional modules; a JSON-able dict."""
    with tempfile.TemporaryDirectory(prefix="bench_import_pyc_") as pycache_dir:
        env = _child_env(None if as_configured else pycache_dir)
        result = _measure(runs, env)
        modules = json.loads(_run_python(_MODULES_SCRIPT.format(names=OPTIONAL_MODULES), env)[2])
    result.update(
        runs=runs,
        bytecode="as configured" if as_configured else "cached (temporary PYTHONPYCACHEPREFIX)",
        python=sys.version.split()[0],
        modules=modules,
    )
    return result


def format_report(result: dict[str, Any]) -> str:
    met = {k: "met" if v else "NOT met" for k, v in result["target_met"].items()}
    spread = max(result["import_torch_s"]) - min(result["import_torch_s"])
    modules = result["modules"]
    not_loaded = [
        m
        for m in OPTIONAL_MODULES
        if m not in modules["by_torch"] and m not in modules["by_trainer"]
    ]
    return "\n".join(
        [
            f"{result['runs']} interleaved runs each, bytecode {result['bytecode']}, "
            f"Python {result['python']}",
            "",
            "| command | median s | runs (s) |",
            "|---|---:|---|",
            _row("python -c 'import torch'", result["import_torch_s"]),
            _row("python -c 'import torch, trainer'", result["import_torch_trainer_s"]),
            _row("CPU time of `import torch`", result["cpu_import_torch_s"]),
            _row("CPU time of `import torch, trainer`", result["cpu_import_torch_trainer_s"]),
            _row("`import trainer` after torch, in-process", result["import_trainer_in_process_s"]),
            "",
            f"import trainer over import torch, target ≤ {result['target_delta_s']:.2f} s:",
            f"- wall: {result['delta_median_s']:+.3f} s (difference of medians; paired median "
            f"{result['delta_paired_median_s']:+.3f} s; `import torch` alone spread over "
            f"{spread:.3f} s): {met['wall']}",
            f"- CPU time: {result['cpu_delta_median_s']:+.3f} s: {met['cpu']}",
            f"- in-process `import trainer` after torch: "
            f"{result['import_trainer_in_process_median_s']:.3f} s: {met['in_process']}",
            "",
            f"optional modules loaded by `import torch`: {modules['by_torch'] or 'none'}",
            f"optional modules loaded by `import trainer`: {modules['by_trainer'] or 'none'}",
            f"not loaded: {not_loaded or 'none'}",
            f"`import trainer` added {modules['added_count']} modules; packages outside "
            f"trainer among them: {modules['added_outside_trainer'] or 'none'}",
        ]
    )


def _row(label: str, seconds: list[float]) -> str:
    runs = ", ".join(f"{s:.3f}" for s in seconds)
    return f"| {label} | {statistics.median(seconds):.3f} | {runs} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each command")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--as-configured",
        action="store_true",
        help="run the children with the environment unchanged (no temporary bytecode cache)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs expects an int >= 1, received {args.runs}")
    result = run_benchmark(runs=args.runs, as_configured=args.as_configured)
    print(format_report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
