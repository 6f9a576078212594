"""Run as a script: ``accelerate`` trains 2 epochs with Hugging Face Accelerate, saves its state
to ``acc_state`` in the working folder and trains a 3rd; ``trainer`` loads that folder with
trainer.Accelerator and trains the 3rd epoch. Each prints the 3rd epoch's losses as JSON."""

import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

if sys.argv[1] == "accelerate":
    from accelerate import Accelerator
else:
    from trainer import Accelerator

torch.manual_seed(0)
accelerator = Accelerator()
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 5, 0.5)
generator = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 8, generator=generator), torch.randn(64, 4, generator=generator)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)


def train_epoch() -> list[float]:
    losses = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


if sys.argv[1] == "accelerate":
    train_epoch()
    train_epoch()
    accelerator.save_state("acc_state")
else:
    accelerator.load_state("acc_state")
print(json.dumps(train_epoch()))
