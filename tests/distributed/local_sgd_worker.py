"""LocalSGD inside one torchrun job of 2 processes (DDP, gloo on CPU).

Process r trains its own half of the data (samples r, r+2, ...) in batches of 4 with SGD,
``local_sgd_steps=3``: steps 1-3 apart, an average, step 4 apart, an average on leaving the
context. Records whether the replicas differed after step 1 (no gradient all-reduce), the final
weights, and the same run with ``enabled=False`` (plain DDP). Facts go to OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from trainer import Accelerator
from trainer.accelerator.local_sgd import LocalSGD

LR = 0.1
STEPS = 3


def data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s batches of 4: samples rank, rank + 2, ... of 32."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return list(zip(x[rank::2].split(4), y[rank::2].split(4)))


def train(accelerator: Accelerator, rank: int, enabled: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    facts: dict[str, Any] = {}
    with LocalSGD(accelerator, model, local_sgd_steps=STEPS, enabled=enabled) as local_sgd:
        for x, y in data(rank):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            if local_sgd.num_steps == 1:
                weight = accelerator.unwrap_model(model).weight.detach()
                both = accelerator.gather(weight)
                facts["differ_after_step_1"] = not torch.equal(both[0], both[1])
    facts["num_steps"] = local_sgd.num_steps
    facts["weights"] = {
        k: v.flatten().tolist() for k, v in accelerator.unwrap_model(model).state_dict().items()
    }
    return facts


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    accelerator = Accelerator(cpu=True)
    facts = {
        "distributed_type": str(accelerator.distributed_type),
        "local_sgd": train(accelerator, rank, enabled=True),
        "disabled": train(accelerator, rank, enabled=False),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
