"""Sharded checkpoint save/load speed: FSDPStrategy's checkpoints against raw DCP, 2 processes.

Run it with torchrun (gloo on CPU here; NCCL on GPUs):

    torchrun --standalone --nproc_per_node 2 benchmarks/bench_checkpoint_fsdp.py --rounds 5

Each process shards the model of ``bench_checkpoint.py`` (a stack of ``Linear(4096, 4096)``,
``--params`` parameters, 100,687,872 and 403 MB fp32 by default) with ``FSDPStrategy`` (one
``fully_shard`` per Linear, then the root), and each round times, in turn, the order rotated:

  save: ``FSDPStrategy.save_checkpoint`` (every rank writes its DCP shards to a staging folder,
        hashing them as DCP writes them, rank 0 moves them into an atomic directory,
        writes ``state.json`` and the manifest with every rank's digests, then renames it into
        place);
        raw ``torch.distributed.checkpoint.save`` (DCP's FileSystemWriter fsyncs each file).
  load: ``FSDPStrategy.load_checkpoint`` (every rank checks the listing and the digests of its
        share of the files, the ranks agree, DCP's metadata is read with an allow-list
        unpickler, then ``dcp.load``);
        raw ``dcp.load`` into the same sharded state dict.

Lightning's and Accelerate's FSDP sharded checkpoints are DCP's files too (written by the same
``dcp.save``), so raw DCP is their figure as well. Every timed operation starts after
``os.sync()`` and a barrier and ends with a barrier, so a time is the slowest rank's. Ratios are
per round (raw time / trainer time), min-median. Targets: save >= 0.9x, load >= 0.8x.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # before any process group (docs/reliability.md)

TARGETS = {"save": 0.9, "load": 0.8}


def build_model(params: float) -> torch.nn.Module:
    """The model of bench_checkpoint.py: ``Linear(4096, 4096)`` layers, about ``params`` in all."""
    width = 4096
    layers = max(1, round(params / (width * width + width)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _timed(function: Callable[[], object]) -> float:
    os.sync()
    gc.collect()
    dist.barrier()
    start = time.perf_counter()
    function()
    dist.barrier()
    return time.perf_counter() - start


def run(params: float, rounds: int, directory: str) -> tuple[dict[str, list[float]], int]:
    """Seconds of each operation per round (one untimed round first), and the parameter count."""
    import torch.distributed.checkpoint as dcp

    from trainer.strategies import FSDPStrategy

    strategy = FSDPStrategy("cpu", auto_wrap_policy={torch.nn.Linear})
    strategy.setup_environment()
    torch.manual_seed(0)
    model = strategy.setup_module(build_model(params))
    ours, raw = os.path.join(directory, "ck"), os.path.join(directory, "raw")

    def save_trainer() -> None:
        state = strategy.module_state_dict(model, full=False)
        strategy.save_checkpoint(ours, {"state_dict": state, "epoch": 0, "global_step": 0})

    def load_raw() -> None:
        dcp.load({"model": strategy.module_state_dict(model, full=False)}, checkpoint_id=raw)

    operations: dict[str, dict[str, Callable[[], object]]] = {
        "save": {
            "save trainer": save_trainer,
            "save raw dcp": lambda: dcp.save(
                {"model": strategy.module_state_dict(model, full=False)}, checkpoint_id=raw
            ),
        },
        "load": {
            "load trainer": lambda: strategy.load_checkpoint(ours, model),
            "load raw dcp": load_raw,
        },
    }
    times: dict[str, list[float]] = {name: [] for group in operations.values() for name in group}
    for index in range(rounds + 1):
        for group in operations.values():
            names = list(group)
            for name in names[index % 2 :] + names[: index % 2]:
                seconds = _timed(group[name])
                if index:  # round 0 warms up imports, the page cache, the files to replace
                    times[name].append(seconds)
    return times, sum(p.numel() for p in model.parameters())  # a DTensor counts all its shards


def summarize(times: dict[str, list[float]], params: int, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "params": params,
        "rounds": rounds,
        "world_size": dist.get_world_size(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "times": times,
        "medians": {name: statistics.median(values) for name, values in times.items()},
        "ratios": {},
    }
    for kind, target in TARGETS.items():
        ratios = sorted(
            raw / ours for raw, ours in zip(times[f"{kind} raw dcp"], times[f"{kind} trainer"])
        )
        median = statistics.median(ratios)
        result["ratios"][kind] = {
            "min": ratios[0],
            "median": median,
            "target": target,
            "met": median >= target,
        }
    return result


def format_report(result: dict[str, Any]) -> str:
    params = result["params"]
    lines = [
        f"FSDP, {result['world_size']} processes, model {params:,} parameters "
        f"({params * 4 / 1e6:.0f} MB fp32), {result['rounds']} rounds, {result['cpu_count']} CPUs, "
        f"load average {result['load_average']}",
        "",
        "| operation | median s | min s | max s |",
        "|---|---:|---:|---:|",
    ]
    for name, values in result["times"].items():
        lines.append(
            f"| {name} | {result['medians'][name]:.3f} | {min(values):.3f} | {max(values):.3f} |"
        )
    lines += ["", "| trainer vs raw DCP | speed ratio, min-median | target | met? |"]
    lines.append("|---|---:|---:|---|")
    for kind, ratio in result["ratios"].items():
        lines.append(
            f"| {kind} | {ratio['min']:.2f}-{ratio['median']:.2f} | ≥ {ratio['target']:.1f} | "
            f"{'yes' if ratio['met'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=r".*Detected an existing checkpoint.*")  # raw's dir
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # One folder for all ranks: rank 0 creates it and broadcasts its name.
    folder = [
        tempfile.mkdtemp(prefix="bench-ckpt-fsdp-", dir=os.environ.get("BENCH_DIR"))
        if rank == 0
        else None
    ]
    dist.broadcast_object_list(folder, src=0)
    try:
        times, params = run(args.params, args.rounds, folder[0])
        result = summarize(times, params, args.rounds)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    if rank == 0:
        print(format_report(result))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as file:
                json.dump(result, file, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
