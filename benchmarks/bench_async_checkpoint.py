"""How long a checkpoint save blocks the training loop: synchronous against AsyncCheckpointIO.

One process trains a stack of ``Linear(2048, 2048)`` layers (~25M parameters by default, about
100 MB fp32; ``--params 100e6`` for ~100M) with plain SGD on random data, three times in one run,
interleaved over ``--rounds``:

- ``none``: no checkpoints (the steps/s baseline);
- ``sync``: ``ModelCheckpoint(every_n_train_steps=N)``, written on the training thread;
- ``async``: the same with ``plugins=[AsyncCheckpointIO()]``.

Per save it records the time the loop spent inside ``ModelCheckpoint.save`` (for ``async``:
waiting for the previous save, gathering the state and copying it to host memory), and per run
the steps/s of the whole ``fit`` (the final wait for the last save included). Checkpoints go to
a temporary folder (``BENCH_DIR`` chooses where) and keep the latest one (``save_top_k=1``).

    python -m benchmarks.bench_async_checkpoint [--params 25e6] [--steps 60] [--every 10]
        [--rounds 2] [--batch 8] [--accelerator cpu|cuda] [--json out.json]

With ``--accelerator cuda`` the model trains on the GPU and the background save first copies
the state into pinned host memory (scripts/gpu_checks.sh runs it so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.callbacks import ModelCheckpoint
from trainer.plugins import AsyncCheckpointIO

WIDTH = 2048
VARIANTS = ("none", "sync", "async")


class Stack(trainer.TrainModule):
    def __init__(self, params: float) -> None:
        super().__init__()
        layers = max(1, round(params / (WIDTH * WIDTH + WIDTH)))
        self.net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


class TimedCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that records how long each save held the training loop.

    It times the public hook that saves every ``every_n_train_steps`` (``on_train_batch_end``),
    on the steps where a save is due, so it does not depend on how the callback is built inside.
    """

    def __init__(self, *, every_n_train_steps: int, **kwargs: Any) -> None:
        super().__init__(every_n_train_steps=every_n_train_steps, **kwargs)
        self.every = every_n_train_steps
        self.blocked_s: list[float] = []

    def on_train_batch_end(self, trainer: trainer.Trainer, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(trainer, *args, **kwargs)
        if trainer.global_step > 0 and trainer.global_step % self.every == 0:
            self.blocked_s.append(time.perf_counter() - start)


def run_once(variant: str, args: argparse.Namespace, directory: str) -> dict[str, Any]:
    """One fit; its steps/s and, with checkpoints, the blocked time of each save."""
    torch.manual_seed(0)
    module = Stack(args.params)
    data = TensorDataset(torch.randn(args.batch * args.steps, WIDTH))
    loader = DataLoader(data, batch_size=args.batch)
    callback = TimedCheckpoint(
        dirpath=os.path.join(directory, variant), every_n_train_steps=args.every, save_top_k=1
    )
    io = AsyncCheckpointIO() if variant == "async" else None
    fit = trainer.Trainer(
        max_steps=args.steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=variant != "none",
        callbacks=[callback] if variant != "none" else [], accelerator=args.accelerator,
        plugins=[io] if io is not None else None, default_root_dir=directory,
    )  # fmt: skip
    start = time.perf_counter()
    fit.fit(module, loader)
    seconds = time.perf_counter() - start
    shutil.rmtree(os.path.join(directory, variant), ignore_errors=True)
    result: dict[str, Any] = {"steps_per_s": args.steps / seconds, "fit_s": seconds}
    if variant != "none":
        result["blocked_s"] = callback.blocked_s
    if io is not None:
        result["snapshot_s_last"] = io.last_snapshot_s
        result["waited_s_total"] = io.total_wait_s
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=25e6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="save every N optimizer steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="bench-async-ckpt-", dir=os.environ.get("BENCH_DIR"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    try:
        run_once("none", argparse.Namespace(**{**vars(args), "steps": 5}), directory)  # warm-up
        for _ in range(args.rounds):
            for variant in VARIANTS:
                runs[variant].append(run_once(variant, args, directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    summary = summarize(runs)
    params = sum(p.numel() for p in Stack(args.params).parameters())
    print(
        f"model: {params:,} parameters ({params * 4 / 1e6:.0f} MB fp32, SGD: no optimizer "
        f"state), {args.steps} steps of batch {args.batch}, a save every {args.every} steps, "
        f"{args.rounds} rounds, {torch.get_num_threads()} threads, on {args.accelerator}"
    )
    print_summary(summary, params, args, runs)
    return 0


def print_summary(
    summary: dict[str, dict[str, float]], params: int, args: argparse.Namespace, runs: Any
) -> None:
    """The table of `summarize`'s figures (this benchmark's and the FSDP one's); ``--json``."""
    print("| run | blocked per save, median s | max s | steps/s (median) | vs no checkpoints |")
    print("|---|---|---|---|---|")
    for variant in summary:
        row = summary[variant]
        blocked = (
            f"{row['blocked_median_s']:.3f} | {row['blocked_max_s']:.3f}"
            if "blocked_median_s" in row
            else "- | -"
        )
        print(f"| {variant} | {blocked} | {row['steps_per_s']:.2f} | {row['vs_none']:.3f} |")
    ratio = summary["async"]["blocked_median_s"] / summary["sync"]["blocked_median_s"]
    print(f"async blocks the loop for {ratio:.1%} of a synchronous save (median per save)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(
                {"params": params, "config": vars(args), "runs": runs, "summary": summary},
                file,
                indent=1,
            )


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Medians per variant; steps/s relative to the no-checkpoint runs."""
    base = statistics.median(run["steps_per_s"] for run in runs["none"])
    summary: dict[str, dict[str, float]] = {}
    for variant, results in runs.items():
        speed = statistics.median(run["steps_per_s"] for run in results)
        row = {"steps_per_s": speed, "vs_none": speed / base}
        blocked = [s for run in results for s in run.get("blocked_s", [])]
        if blocked:
            row["blocked_median_s"] = statistics.median(blocked)
            row["blocked_max_s"] = max(blocked)
        summary[variant] = row
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
