"""ModelParallelStrategy checks inside one real torchrun job (gloo on CPU).

With 2 processes the mesh is DP=1 x TP=2, with 4 processes DP=2 x TP=2 (sizes left "auto" and
given, respectively). Writes each rank's facts to OUT/rank<r>.json and, on rank 0, the full
final weights to OUT/final.safetensors for the dense one-process reference of
tests/distributed/test_model_parallel.py. OUT/sharded is a mid-run DCP checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

LR = 0.01
CLIP = 0.5


def regression(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, torch.tanh(x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])))


class Net(trainer.TrainModule):
    """LayerNorm(4) -> Linear(4, 8) -> tanh -> Linear(8, 1); the linears split when a mesh is given.

    The norm stays out of the tensor-parallel plan: after FSDP it lives on the 1-D data-parallel
    mesh while the linears live on the 2-D mesh, which gradient clipping must handle.
    """

    def __init__(self, is_parallel: bool = True) -> None:
        super().__init__()
        self.is_parallel = is_parallel
        self.norm = torch.nn.LayerNorm(4)
        self.inp = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 1)

    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        if not self.is_parallel or hasattr(self.inp.weight, "device_mesh"):
            return
        mesh = self.trainer.strategy.device_mesh["tensor_parallel"]
        parallelize_module(self, mesh, {"inp": ColwiseParallel(), "out": RowwiseParallel()})

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.out(torch.tanh(self.inp(self.norm(x)))), y)
        self.log("train/loss", loss, sync_dist=True)
        # Summed over the data-parallel group: 64 per epoch, not 64 x tensor_parallel_size.
        self.log(
            "samples_seen",
            float(len(x)),
            on_step=False,
            on_epoch=True,
            reduce_fx="sum",
            sync_dist=True,
        )
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=LR)


def quiet(strategy: Any, **kwargs: Any) -> trainer.Trainer:
    options: dict[str, Any] = dict(
        strategy=strategy, accelerator="cpu", enable_progress_bar=False,
        enable_model_summary=False, logger=False, enable_checkpointing=False,
        num_sanity_val_steps=0, gradient_clip_val=CLIP, seed=0,
    )  # fmt: skip
    options.update(kwargs)
    return trainer.Trainer(**options)


def strategy_for(world_size: int) -> Any:
    from trainer.strategies import ModelParallelStrategy

    if world_size == 2:  # "auto": tensor parallel within the machine
        return ModelParallelStrategy("cpu")
    return ModelParallelStrategy("cpu", data_parallel_size=2, tensor_parallel_size=2)


def loader() -> DataLoader:
    return DataLoader(regression(), batch_size=4, shuffle=False)


def full_weights(fit: trainer.Trainer, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in fit.accelerator.get_state_dict(module).items()}


def main(out: str) -> None:
    # Gathering (_StridedShard, Shard) weights takes two all-gathers; torch logs that once.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    facts: dict[str, Any] = {}

    torch.manual_seed(0)
    module = Net()
    fit = quiet(strategy_for(world), max_epochs=2)
    strategy = fit.strategy
    facts["mesh"] = [strategy.data_parallel_size, strategy.tensor_parallel_size]
    facts["sampler_kwargs"] = strategy.distributed_sampler_kwargs
    fit.fit(module, loader())
    facts["num_training_batches"] = fit.num_training_batches
    facts["placements"] = {
        name: [str(p) for p in param.placements] for name, param in module.named_parameters()
    }
    facts["train_loss"] = float(fit.callback_metrics["train/loss"])
    facts["samples_seen"] = float(fit.callback_metrics["samples_seen"])
    facts["sum_of_ones"] = float(strategy.all_reduce(torch.tensor(1.0), "sum"))
    facts["max_of_ranks"] = float(strategy.all_reduce(torch.tensor(float(rank)), "max"))
    weights = full_weights(fit, module)
    if rank == 0:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in weights.items()}, os.path.join(out, "final.safetensors")
        )

    if world == 2:  # sharded checkpoint mid-epoch, resumed from other initial weights: exact
        torch.manual_seed(0)
        first = Net()
        part = quiet(strategy_for(world), max_epochs=2, max_steps=5)
        part.fit(first, loader())
        part.save_checkpoint(os.path.join(out, "sharded"))
        torch.manual_seed(3)
        resumed = Net()
        again = quiet(strategy_for(world), max_epochs=2)
        again.fit(resumed, loader(), ckpt_path=os.path.join(out, "sharded"))
        resumed_weights = full_weights(again, resumed)
        facts["resume_equal"] = (
            all(torch.equal(resumed_weights[k], weights[k]) for k in weights) if rank == 0 else True
        )

    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    main(sys.argv[1])
