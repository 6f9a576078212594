"""Run ``trainer launch --num_processes 2`` of a tiny DDP fit many times back to back.

Counts the runs that did not end with status 0, did not write both ranks' result files, or printed
an abort ("terminate called",
"Aborted", SIGABRT) — the exit failures of issue #13. Usage:

    python scripts/launch_repeat.py --runs 50

Prints one line per failing run (with the path of its log) and a summary line such as
``50 runs: 50 exit 0, 0 aborted, 0 other failures; wall time median 11.2 s (min 10.8, max 12.5)``.
Exits with status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "tests" / "distributed" / "launch_target.py"
ABORT_MARKS = ("terminate called", "Aborted", "SIGABRT", "Signal 6")


def run_once(out: Path) -> tuple[int, str, float]:
    """One launch; returns (exit status, combined output, wall seconds)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "trainer.cli", "launch", "--num_processes", "2"]
    start = time.perf_counter()
    result = subprocess.run(
        [*command, str(TARGET), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    return result.returncode, result.stdout + result.stderr, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="how many launches (default 50)")
    args = parser.parse_args()
    aborted = other = 0
    times: list[float] = []
    logs = Path(tempfile.mkdtemp(prefix="launch-repeat-"))
    for index in range(1, args.runs + 1):
        out = logs / f"run{index:03d}"
        out.mkdir()
        status, output, seconds = run_once(out)
        times.append(seconds)
        is_abort = any(mark in output for mark in ABORT_MARKS)
        is_missing = sorted(p.name for p in out.glob("rank*.json")) != ["rank0.json", "rank1.json"]
        if status != 0 or is_abort or is_missing:
            (out / "output.log").write_text(output, encoding="utf-8")
            aborted += is_abort
            other += not is_abort
            kind = "aborted" if is_abort else f"exit {status}, rank files missing: {is_missing}"
            print(f"run {index}: {kind} (log: {out / 'output.log'})", flush=True)
    clean = args.runs - aborted - other
    print(
        f"{args.runs} runs: {clean} exit 0, {aborted} aborted, {other} other failures; wall time "
        f"median {statistics.median(times):.1f} s (min {min(times):.1f}, max {max(times):.1f})"
    )
    return 0 if clean == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
