"""ZeRO stages against DDP on CPU: training throughput, and peak memory per rank.

Run it with torchrun (gloo on CPU here):

    torchrun --standalone --nproc_per_node 2 benchmarks/bench_deepspeed.py throughput --steps 100
    MALLOC_MMAP_THRESHOLD_=1048576 torchrun --standalone --nproc_per_node 2 \\
        benchmarks/bench_deepspeed.py memory --engine zero2

``throughput`` trains, in one job and interleaved over rounds, the same MLP (width 256, depth 4,
~264k parameters, AdamW, batch 32 per process) with Trainer(strategy="ddp"), Trainer(strategy=
DeepSpeedStrategy(stage=1|2|3)) and a raw DeepSpeed ZeRO-2 loop (``deepspeed.initialize`` with the
config the strategy builds, then ``engine(x)``, ``engine.backward``, ``engine.step``). It times the
training loop only (first to last batch, behind a barrier) and reports the setup (engine build)
separately. ``memory`` builds a ~50M-parameter MLP (width 2048, depth 12) with AdamW under one
engine, trains 3 steps through the Accelerator and prints each rank's peak RSS growth
(ru_maxrss minus the RSS before the model was built) and its growth at the end, as JSON.
``--config '{"zero_optimization": {...}}'`` adds DeepSpeed options. Run one engine per launch:
the peak is the process's. ZeRO-3 partitions the model at ``deepspeed.initialize``, so each rank
holds the full fp32 model once while it is built (zero.Init is not used).

On CPU, run the memory mode with ``MALLOC_MMAP_THRESHOLD_=1048576`` (see bench_distributed.py:
glibc otherwise keeps freed buffers resident and the peak measures the allocator).

DDPStrategy's teardown runs ``gc.collect()``; with DeepSpeed imported that walks DeepSpeed's
objects (about a second). The script freezes the collector after importing, so that a round
compares training, not collection.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainer
from trainer.callbacks import Callback
from trainer.strategies import DDPStrategy, DeepSpeedStrategy

if not __package__:  # run as a file (`torchrun benchmarks/bench_deepspeed.py`): find `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_distributed import Module, data, mlp, rss_mb


class LoopTimer(Callback):
    """Wall and CPU seconds from the first batch to the end of the last (behind barriers)."""

    def __init__(self) -> None:
        self.start = (0.0, 0.0)
        self.seconds = (0.0, 0.0)

    def on_train_start(self, trainer, module) -> None:
        trainer.strategy.barrier()
        self.start = (time.perf_counter(), time.process_time())

    def on_train_end(self, trainer, module) -> None:
        cpu = time.process_time() - self.start[1]  # before the barrier: its wait is not work
        trainer.strategy.barrier()
        self.seconds = (time.perf_counter() - self.start[0], cpu)


def with_trainer(
    strategy: Any, width: int, depth: int, dataset: TensorDataset
) -> tuple[float, float, float]:
    """(loop wall s, loop CPU s, setup + teardown wall s) of one Trainer.fit epoch."""
    torch.manual_seed(0)
    timer = LoopTimer()
    fit = trainer.Trainer(
        strategy=strategy, accelerator="cpu", max_epochs=1, enable_progress_bar=False,
        enable_model_summary=False, logger=False, enable_checkpointing=False, callbacks=[timer],
    )  # fmt: skip
    dist.barrier()
    start = time.perf_counter()
    fit.fit(Module(width, depth), DataLoader(dataset, batch_size=32))
    return *timer.seconds, time.perf_counter() - start - timer.seconds[0]


def raw_ddp(width: int, depth: int, dataset: TensorDataset) -> tuple[float, float, float]:
    """A hand-written DDP loop."""
    torch.manual_seed(0)
    start = time.perf_counter()
    model = torch.nn.parallel.DistributedDataParallel(mlp(width, depth))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    setup = time.perf_counter() - start
    return (*raw_loop(model, optimizer.step, dataset), setup)


def raw_loop(model: Any, step: Any, dataset: TensorDataset) -> tuple[float, float]:
    """(wall s, CPU s) of one epoch of ``model`` with ``backward`` then ``step`` per batch."""
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset, shuffle=False))
    backward = getattr(model, "backward", None)
    dist.barrier()
    start = (time.perf_counter(), time.process_time())
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if backward is not None:
            backward(loss, scale_wrt_gas=False)
        else:
            loss.backward()
        step()
        if backward is None:
            model.zero_grad(set_to_none=True)
    cpu = time.process_time() - start[1]
    dist.barrier()
    return time.perf_counter() - start[0], cpu


def raw_deepspeed(width: int, depth: int, dataset: TensorDataset) -> tuple[float, float, float]:
    """A hand-written DeepSpeed ZeRO-2 loop with the config DeepSpeedStrategy builds."""
    import deepspeed

    strategy = DeepSpeedStrategy("cpu", stage=2)
    torch.manual_seed(0)
    model = mlp(width, depth)
    start = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        config=strategy.engine_config(micro_batch_size=32),
        dist_init_required=False,
    )
    setup = time.perf_counter() - start
    return (*raw_loop(engine, engine.step, dataset), setup)


def throughput(steps: int, rounds: int, width: int, depth: int) -> None:
    world = dist.get_world_size()
    dataset = data(steps, width, world)
    strategies: dict[str, Any] = {"Trainer ddp": lambda: DDPStrategy("cpu")}
    for stage in (1, 2, 3):
        strategies[f"Trainer deepspeed ZeRO-{stage}"] = lambda s=stage: DeepSpeedStrategy(
            "cpu", stage=s
        )
    variants = {
        name: (lambda make=make: with_trainer(make(), width, depth, dataset))
        for name, make in strategies.items()
    }
    variants["raw DDP"] = lambda: raw_ddp(width, depth, dataset)
    variants["raw DeepSpeed ZeRO-2"] = lambda: raw_deepspeed(width, depth, dataset)
    loops: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    setups: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, run in variants.items():
            loop, cpu, setup = run()
            loops.setdefault(name, []).append(loop)
            cpus.setdefault(name, []).append(cpu)
            setups.setdefault(name, []).append(setup)
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in mlp(width, depth).parameters())
        load = os.getloadavg()[0]
        print(
            f"{world} processes, {params:,}-parameter MLP, batch 32/process, {steps} steps, "
            f"{rounds} rounds, AdamW, fp32, torch {torch.__version__}, load average {load:.1f}"
        )
        print(
            "| variant | steps/s (wall) | vs Trainer ddp | CPU ms/step (rank 0) | "
            "setup + teardown s |"
        )
        print("|---|---:|---:|---:|---:|")
        ddp = statistics.median(loops["Trainer ddp"])
        for name, values in loops.items():
            median = statistics.median(values)
            cpu_ms = 1000 * statistics.median(cpus[name]) / steps
            print(
                f"| {name} | {steps / median:.1f} | {ddp / median:.2f}x | {cpu_ms:.2f} | "
                f"{statistics.median(setups[name]):.3f} |"
            )


def memory(engine: str, width: int, depth: int, config: dict[str, Any] | None) -> None:
    strategy = (
        DDPStrategy("cpu")
        if engine == "ddp"
        else DeepSpeedStrategy("cpu", stage=int(engine[-1]), config=config)
    )
    accelerator = trainer.Accelerator(strategy=strategy)
    baseline = rss_mb()
    torch.manual_seed(0)
    model = mlp(width, depth)
    params = sum(p.numel() for p in model.parameters())
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randn(32, width)
    for _ in range(3):
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    after = rss_mb()
    result = {
        "engine": engine,
        "config": config,
        "rank": accelerator.process_index,
        "params": params,
        "peak_growth_mb": round(peak - baseline, 1),
        "end_growth_mb": round(after - baseline, 1),
        "baseline_mb": round(baseline, 1),
    }
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["throughput", "memory"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=["ddp", "zero1", "zero2", "zero3"], default="ddp")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--config", type=json.loads, default=None, help="a DeepSpeed config (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401  (before freezing: see the module docstring)

    gc.freeze()
    if args.mode == "throughput":
        trainer.Accelerator(strategy=DeepSpeedStrategy("cpu"))  # joins the process group
        throughput(args.steps, args.rounds, args.width or 256, args.depth or 4)
    else:
        memory(args.engine, args.width or 2048, args.depth or 12, args.config)  # ~50M parameters


if __name__ == "__main__":
    main()
