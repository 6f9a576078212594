"""One rank of the join_uneven_inputs job (tests/distributed/test_join_uneven_inputs.py).

Two processes train a DDP model on 10 samples, batch 2, ``even_batches=False`` inside
``accelerator.join_uneven_inputs([model])``: rank 0 gets 3 batches, rank 1 gets 2, and the rank
that runs out joins, shadowing the gradient all-reduce, so rank 0's last step neither hangs nor
leaves the replicas apart. Writes ``rank<N>.json``: its batch count, the weights after training,
and the loaders' even_batches inside and after the block.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.accelerator import Accelerator


def main(out: str) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.ones(10, 1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=2))
    batches = 0
    with accelerator.join_uneven_inputs([model], even_batches=False):
        inside = loader.batch_sampler.even_batches
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            batches += 1
    facts = {
        "batches": batches,
        "even_batches_inside": inside,
        "even_batches_after": loader.batch_sampler.even_batches,
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
    }
    rank = accelerator.process_index
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
