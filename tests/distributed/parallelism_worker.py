"""ParallelismConfig layouts inside one torchrun job (gloo on CPU), each against one process.

For every layout of ``LAYOUTS[world_size]`` the worker builds the strategy with
``strategy_for_parallelism``, trains LayerNorm -> Linear -> tanh -> Linear for one epoch with
an Accelerator loop (batch 4 per data-parallel rank, AdamW, clipping), gathers the full weights
(HSDP also saves DCP shards to OUT/hsdp and loads them back over zeroed weights) and, on rank 0, trains the dense model in this process with the global batch
(4 x data-parallel size) and records the largest difference. It also records Accelerate's
rank properties (``data_parallel_rank`` ...) beside the mesh's own local ranks. Facts go to
OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator
from trainer.accelerator.parallelism import ParallelismConfig, strategy_for_parallelism

LR = 0.01
RANK_PROPERTIES = {
    "dp_replicate": "data_parallel_rank",
    "dp_shard": "data_parallel_shard_rank",
    "cp": "context_parallel_rank",
    "tp": "tensor_parallel_rank",
}
CLIP = 0.5
LAYOUTS: dict[int, list[dict[str, int]]] = {
    2: [{"dp_shard_size": 2}, {"dp_replicate_size": 2}, {"tp_size": 2}, {}],
    4: [{"dp_replicate_size": 2, "dp_shard_size": 2}, {"dp_shard_size": 2, "tp_size": 2}],
}


def regression(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, torch.tanh(x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.inp = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(self.norm(x))))


def dense_weights(batch_size: int) -> dict[str, torch.Tensor]:
    """The same training in this process without any parallelism."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for x, y in DataLoader(regression(), batch_size=batch_size):
        torch.nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def run_layout(sizes: dict[str, int], rank: int, out: str) -> dict[str, Any]:
    config = ParallelismConfig(**sizes)
    if sizes:  # Accelerate's way; the strategy itself for the empty layout
        accelerator = Accelerator(cpu=True, parallelism_config=config)
    else:
        accelerator = Accelerator(strategy=strategy_for_parallelism(config, accelerator="cpu"))
    strategy = accelerator.strategy
    torch.manual_seed(0)
    model = Net()
    if config.tp_enabled:  # the user's plan, on the mesh's "tp" dim, before prepare
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        plan = {"inp": ColwiseParallel(), "out": RowwiseParallel()}
        parallelize_module(model, strategy.device_mesh["tp"], plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(regression(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        accelerator.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    full = accelerator.get_state_dict(model)
    replicas = strategy.distributed_sampler_kwargs["num_replicas"]
    weight = accelerator.unwrap_model(model).inp.weight
    facts: dict[str, Any] = {
        "strategy": type(strategy).__name__,
        "data_parallel": [replicas, strategy.distributed_sampler_kwargs["rank"]],
        "steps": steps,
        "placements": [str(p) for p in getattr(weight, "placements", ())],
        "mesh_dims": list(getattr(weight, "device_mesh", None).mesh_dim_names or ())
        if hasattr(weight, "device_mesh")
        else [],
    }
    if sizes:  # Accelerate's rank properties, and what the mesh itself says
        mesh = accelerator.torch_device_mesh
        facts["ranks"] = {dim: getattr(accelerator, attr) for dim, attr in RANK_PROPERTIES.items()}
        facts["mesh_ranks"] = (
            None if mesh is None else {dim: mesh.get_local_rank(dim) for dim in RANK_PROPERTIES}
        )
    if config.dp_replicate_enabled and config.dp_shard_enabled:  # HSDP: DCP shards round trip
        folder = accelerator.save_state(os.path.join(out, "hsdp"))
        with torch.no_grad():
            for param in model.parameters():
                param.zero_()
        accelerator.load_state(folder)
        again = accelerator.get_state_dict(model)
        facts["resume_equal"] = all(torch.equal(again[k], full[k]) for k in full)
    if rank == 0:
        expected = dense_weights(4 * replicas)
        facts["max_difference"] = max(
            float((full[name].float() - value).abs().max()) for name, value in expected.items()
        )
    return facts


def main(out: str) -> None:
    # Gathering (_StridedShard, Shard) weights takes two all-gathers; torch logs that once.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    facts = {json.dumps(sizes): run_layout(sizes, rank, out) for sizes in LAYOUTS[world]}
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    main(sys.argv[1])
