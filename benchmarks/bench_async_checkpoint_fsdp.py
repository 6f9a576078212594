"""How long a sharded checkpoint save blocks FSDP training: synchronous against AsyncCheckpointIO.

Run it with torchrun (gloo on CPU here; NCCL on GPUs):

    torchrun --standalone --nproc_per_node 2 benchmarks/bench_async_checkpoint_fsdp.py \
        [--params 25e6] [--steps 30] [--every 10] [--rounds 2] [--batch 8] [--json out.json]

Every process trains bench_async_checkpoint.py's stack of ``Linear(2048, 2048)`` layers (SGD,
random data) sharded by ``FSDPStrategy(auto_wrap_policy={Linear})`` with SHARDED state dicts,
three times per round, interleaved:

- ``none``: no checkpoints (the steps/s baseline);
- ``sync``: ``ModelCheckpoint(every_n_train_steps=N)``: every process writes its DCP shards,
  process 0 commits (manifest with every shard's digest, fsync, rename), on the training thread;
- ``async``: the same with ``plugins=[AsyncCheckpointIO()]``: every process copies its shards to
  host memory and DCP's ``async_save`` writes them; the commit runs on a background thread.

"Blocked" is the time a process's training loop spent in the checkpoint callback's
``on_train_batch_end`` on a step that saves (building the state dicts, waiting for the previous
save, agreeing on the folder, the copy); the table gives the slowest process's. Steps/s is the
whole ``fit``'s, the wait for the last save included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import trainer
from benchmarks.bench_async_checkpoint import WIDTH, Stack, TimedCheckpoint, print_summary
from trainer.plugins import AsyncCheckpointIO
from trainer.strategies import FSDPStrategy
from trainer.strategies.group_lifetime import hold_no_group_in_default_arguments

VARIANTS = ("none", "sync", "async")


def run_once(variant: str, args: argparse.Namespace, directory: str) -> dict[str, Any]:
    """One fit on every process; its steps/s and each save's blocked time (per process)."""
    torch.manual_seed(0)
    module = Stack(args.params)
    data = TensorDataset(torch.randn(args.batch * args.steps * 2, WIDTH))
    callback = TimedCheckpoint(
        dirpath=os.path.join(directory, variant), every_n_train_steps=args.every, save_top_k=1
    )
    io = AsyncCheckpointIO() if variant == "async" else None
    fit = trainer.Trainer(
        max_steps=args.steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=variant != "none",
        callbacks=[callback] if variant != "none" else [], accelerator="cpu",
        strategy=FSDPStrategy("cpu", auto_wrap_policy={torch.nn.Linear}),
        plugins=[io] if io is not None else None, default_root_dir=directory,
    )  # fmt: skip
    dist.barrier()
    start = time.perf_counter()
    fit.fit(module, DataLoader(data, batch_size=args.batch))
    seconds = time.perf_counter() - start
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(os.path.join(directory, variant), ignore_errors=True)
    result: dict[str, Any] = {"steps_per_s": args.steps / seconds, "fit_s": seconds}
    if variant != "none":
        result["blocked_s"] = callback.blocked_s
    if io is not None:
        result["snapshot_s_last"] = io.last_snapshot_s
        result["waited_s_total"] = io.total_wait_s
    return result


def summarize(runs: dict[str, list[list[dict[str, Any]]]]) -> dict[str, dict[str, float]]:
    """Medians per variant over rounds; per save, the slowest process's blocked time."""
    speeds = {
        variant: statistics.median(min(r["steps_per_s"] for r in ranks) for ranks in rounds)
        for variant, rounds in runs.items()
    }
    summary: dict[str, dict[str, float]] = {}
    for variant, rounds in runs.items():
        row = {"steps_per_s": speeds[variant], "vs_none": speeds[variant] / speeds["none"]}
        blocked = [
            max(per_rank)
            for ranks in rounds
            for per_rank in zip(*(r.get("blocked_s", []) for r in ranks), strict=True)
        ]
        if blocked:
            row["blocked_median_s"] = statistics.median(blocked)
            row["blocked_max_s"] = max(blocked)
        summary[variant] = row
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=25e6)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10, help="save every N optimizer steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    hold_no_group_in_default_arguments()  # docs/reliability.md: or the group outlives its end
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    folder = [
        tempfile.mkdtemp(prefix="bench-async-fsdp-", dir=os.environ.get("BENCH_DIR"))
        if rank == 0
        else None
    ]
    dist.broadcast_object_list(folder, src=0)
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in VARIANTS}
    try:
        run_once("none", argparse.Namespace(**{**vars(args), "steps": 3}), folder[0])  # warm-up
        for index in range(args.rounds):
            order = VARIANTS[index % 3 :] + VARIANTS[: index % 3]
            for variant in order:
                mine = run_once(variant, args, folder[0])
                gathered: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, mine)
                runs[variant].append(gathered)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    if rank == 0:
        report(runs, args)
    dist.destroy_process_group()
    return 0


def report(runs: dict[str, list[list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    summary = summarize(runs)
    params = sum(p.numel() for p in Stack(args.params).parameters())
    print(
        f"FSDP, {dist.get_world_size()} processes: {params:,} parameters ({params * 4 / 1e6:.0f} "
        f"MB fp32, SGD: no optimizer state), {args.steps} steps of batch {args.batch} per "
        f"process, a save every {args.every} steps, {args.rounds} rounds, "
        f"{os.cpu_count()} CPUs, load average {[round(x, 2) for x in os.getloadavg()]}"
    )
    print_summary(summary, params, args, runs)


if __name__ == "__main__":
    raise SystemExit(main())
