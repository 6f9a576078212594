"""Run by torchrun: an Accelerator loop (one model, optimizer, shuffled loader, dropout) that
saves its state after an epoch, trains one more, loads the state and trains that epoch again.

Args: strategy name, output folder. Writes ``rank<N>.json`` with both epochs' losses, the
weights' change during the first epoch, and whether the optimizer holds the model's parameters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator


def main(strategy: str, out: Path) -> None:
    accelerator = Accelerator(strategy=strategy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before prepare, as usual
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=generator), torch.randn(64, 4, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def train_epoch() -> list[float]:
        losses = []
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    def local_weights() -> list[torch.Tensor]:  # this rank's shard under FSDP
        return [
            getattr(p, "to_local", lambda p=p: p)().detach().clone() for p in model.parameters()
        ]

    before = local_weights()
    train_epoch()
    after = local_weights()
    accelerator.save_state(out / "state")
    first = train_epoch()
    accelerator.load_state(out / "state")
    second = train_epoch()
    model_params = {id(p) for p in model.parameters()}
    facts = {
        "first": first,
        "second": second,
        "weight_change": max((a - b).abs().max().item() for a, b in zip(after, before)),
        "optimizer_holds_model_params": all(
            id(p) in model_params for group in optimizer.param_groups for p in group["params"]
        ),
    }
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
