"""2-process DDP / FSDP2 throughput against raw loops, and FSDP's memory per rank against DDP's.

Run it with torchrun (gloo on CPU here; NCCL on GPUs):

    torchrun --standalone --nproc_per_node 2 benchmarks/bench_distributed.py throughput --steps 200
    torchrun --standalone --nproc_per_node 2 benchmarks/bench_distributed.py memory --engine ddp
    torchrun --standalone --nproc_per_node 2 benchmarks/bench_distributed.py memory --engine fsdp

``throughput`` times, in one job and interleaved over rounds, a raw DDP loop, Trainer(strategy=
"ddp"), Lightning's Trainer(strategy="ddp") and a hand-written loop on Hugging Face Accelerate
(those two when installed), a raw FSDP2 loop (fully_shard on each block and the root) and
Trainer(strategy=FSDPStrategy) on the same MLP and data (batch 32 per process). ``memory`` builds a ~50M-parameter MLP with
AdamW under one engine, trains 3 steps, and prints each rank's peak RSS growth (ru_maxrss minus
the RSS before the model was built). FSDP builds on the meta device on rank 1 and receives
rank 0's weights (cpu_ram_efficient_loading), as a real large-model run would.

On CPU, run the memory mode with ``MALLOC_MMAP_THRESHOLD_=1048576``: otherwise glibc raises its
mmap threshold after the first large free and keeps FSDP's freed all-gather buffers resident,
so the peak RSS measures the allocator rather than the engine (both figures are in
docs/performance.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import time
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainer
from trainer.strategies import DDPStrategy, FSDPStrategy


def mlp(width: int, depth: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


class Module(trainer.TrainModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.net = mlp(width, depth)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def data(steps: int, width: int, world: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 32 * world, width, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True))


def raw_loop(model: torch.nn.Module, dataset: TensorDataset) -> float:
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset, shuffle=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.barrier()
    return time.perf_counter() - start


def raw_ddp(width: int, depth: int, dataset: TensorDataset) -> float:
    torch.manual_seed(0)
    return raw_loop(torch.nn.parallel.DistributedDataParallel(mlp(width, depth)), dataset)


def raw_fsdp(width: int, depth: int, dataset: TensorDataset) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = mlp(width, depth)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return raw_loop(model, dataset)


def with_trainer(strategy: object, width: int, depth: int, dataset: TensorDataset) -> float:
    torch.manual_seed(0)
    fit = trainer.Trainer(
        strategy=strategy, max_epochs=1, enable_progress_bar=False, enable_model_summary=False,
        logger=False, enable_checkpointing=False, use_distributed_sampler=True,
    )  # fmt: skip
    loader = DataLoader(dataset, batch_size=32)
    dist.barrier()
    start = time.perf_counter()
    fit.fit(Module(width, depth), loader)
    dist.barrier()
    return time.perf_counter() - start


def with_lightning(width: int, depth: int, dataset: TensorDataset) -> float:
    import logging

    import lightning.pytorch as pl

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning(\.|$)")

    class LitModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(width, depth)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    fit = pl.Trainer(
        accelerator="cpu", devices=dist.get_world_size(), strategy="ddp", max_epochs=1,
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, use_distributed_sampler=True,
    )  # fmt: skip
    loader = DataLoader(dataset, batch_size=32)
    dist.barrier()
    start = time.perf_counter()
    fit.fit(LitModule(), loader)
    dist.barrier()
    return time.perf_counter() - start


def with_hf_accelerate(width: int, depth: int, dataset: TensorDataset) -> float:
    from accelerate import Accelerator

    torch.manual_seed(0)
    model = mlp(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=32)
    dist.barrier()
    start = time.perf_counter()
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    dist.barrier()
    return time.perf_counter() - start


def throughput(steps: int, rounds: int, width: int, depth: int) -> None:
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"])
    dataset = data(steps, width, world)
    times: dict[str, list[float]] = {}
    variants = {
        "raw DDP": lambda: raw_ddp(width, depth, dataset),
        "Trainer ddp": lambda: with_trainer(DDPStrategy("cpu"), width, depth, dataset),
        "Lightning ddp": lambda: with_lightning(width, depth, dataset),
        "Accelerate ddp": lambda: with_hf_accelerate(width, depth, dataset),
        "raw FSDP2": lambda: raw_fsdp(width, depth, dataset),
        "Trainer fsdp": lambda: with_trainer(
            FSDPStrategy("cpu", auto_wrap_policy={torch.nn.Linear}), width, depth, dataset
        ),
    }
    for framework, name in (("lightning", "Lightning ddp"), ("accelerate", "Accelerate ddp")):
        if importlib.util.find_spec(framework) is None:
            del variants[name]
    names = list(variants)
    for index in range(rounds):  # interleaved, the order rotated by one each round
        for name in names[index % len(names) :] + names[: index % len(names)]:
            times.setdefault(name, []).append(variants[name]())
            torch.set_num_threads(1)  # whatever a framework set, the next run gets one thread
    times = {name: times[name] for name in names}
    if int(os.environ["RANK"]) == 0:
        params = sum(p.numel() for p in mlp(width, depth).parameters())
        print(
            f"{world} processes, {params:,}-parameter MLP, batch 32/process, {steps} steps, {rounds} rounds, AdamW"
        )
        print("| variant | median s | steps/s | ratio vs raw (min-median) |")
        print("|---|---:|---:|---:|")
        for name, values in times.items():
            raw = times["raw DDP" if "ddp" in name.lower() else "raw FSDP2"]
            ratios = sorted(r / v for r, v in zip(raw, values, strict=True))
            median = statistics.median(values)
            print(
                f"| {name} | {median:.3f} | {steps / median:.1f} | {ratios[0]:.3f}-{statistics.median(ratios):.3f} |"
            )


def rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def memory(engine: str, width: int, depth: int) -> None:
    baseline = rss_mb()
    strategy = (
        DDPStrategy("cpu")
        if engine == "ddp"
        else FSDPStrategy("cpu", auto_wrap_policy={torch.nn.Linear}, cpu_ram_efficient_loading=True)
    )
    accelerator = trainer.Accelerator(strategy=strategy)
    torch.manual_seed(0)
    with strategy.module_init_context():
        model = mlp(width, depth)
    params = sum(p.numel() for p in model.parameters())
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randn(32, width)
    for _ in range(3):
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "engine": engine,
        "rank": accelerator.process_index,
        "params": params,
        "peak_growth_mb": round(peak - baseline, 1),
        "baseline_mb": round(baseline, 1),
    }
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["throughput", "memory"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=["ddp", "fsdp"], default="ddp")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--depth", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mode == "throughput":
        trainer.Accelerator(strategy=DDPStrategy("cpu"))  # joins the process group
        throughput(args.steps, args.rounds, args.width or 256, args.depth or 4)
    else:
        memory(args.engine, args.width or 2048, args.depth or 12)  # ~50M parameters


if __name__ == "__main__":
    main()
