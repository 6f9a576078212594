"""Which calls make the CPU wait for the GPU during training steps (they stop the CPU running ahead).

Runs bench_gpu's GPT (``tiny`` config by default) under the raw loop and under ``Trainer``, with
``torch.cuda.set_sync_debug_mode("warn")`` switched on after the warm-up steps, and prints each
distinct place a synchronizing CUDA call came from (the innermost frames outside torch), with
its count. A raw loop should show none; each line under ``trainer`` is a device sync per step
that the framework adds. Needs CUDA.

    python scripts/cuda_sync_check.py [--config default] [--steps 20]
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_gpu  # noqa: E402


def _where() -> str:
    """The innermost frames of the caller outside torch and this file, as 'file:line' pairs."""
    frames = [
        f for f in traceback.extract_stack()[:-3]
        if "/torch/" not in f.filename and "warnings" not in f.filename
        and not f.filename.endswith("cuda_sync_check.py")
    ]  # fmt: skip
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-4:]))


def syncs_of(variant: str, config: dict[str, int], warmup: int, steps: int) -> collections.Counter:
    """Run ``variant`` (raw / trainer / lightning) and count the synchronizing calls per place."""
    seen: collections.Counter[str] = collections.Counter()
    original = bench_gpu._StepClock.after_step

    def after_step(clock: bench_gpu._StepClock, done: int) -> None:
        if done == clock.total:
            torch.cuda.set_sync_debug_mode(0)
        original(clock, done)
        if done == clock.warmup:
            torch.cuda.set_sync_debug_mode("warn")

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchronizing" in str(message):
            seen[_where()] += 1

    bench_gpu._StepClock.after_step = after_step  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            bench_gpu.RUNNERS[variant](config, warmup, steps, "cuda")
    finally:
        bench_gpu._StepClock.after_step = original  # type: ignore[method-assign]
        torch.cuda.set_sync_debug_mode(0)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=tuple(bench_gpu.CONFIGS), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    config = bench_gpu.CONFIGS[args.config]
    for variant in ("raw", "trainer"):
        seen = syncs_of(variant, config, args.warmup, args.steps)
        total = sum(seen.values())
        print(f"{variant}: {total} synchronizing calls in {args.steps} steps")
        for where, count in seen.most_common():
            print(f"  {count:5d}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
