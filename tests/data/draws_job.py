"""Run by torchrun (2 processes): what prepared loaders take from torch's global generator.

``python -m torch.distributed.run --standalone --nproc_per_node 2 draws_job.py OUT`` writes
``OUT/rank<r>.json``. Each case records ``torch.rand`` draws made after every batch (as dropout
would) over 3 epochs, and one after the last: once through a loader prepared by
``trainer.Accelerator``, once through the plain DataLoader that takes from torch's generator
what Accelerate's prepared loader takes (one value when each pass makes its iterator; one more
at ``prepare`` for a shuffled loader without a generator of its own). ``resume`` records the
draws after a ``save_state`` taken inside an epoch, in the run that went on and in a run
resumed with ``load_state`` + ``skip_first_batches``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator, DataLoaderConfiguration

DATA = TensorDataset(torch.arange(24.0))
EPOCHS = 3


def _draws(loader: Iterable[Any], epochs: int = EPOCHS) -> list[float]:
    drawn = []
    for _ in range(epochs):
        for _ in loader:
            drawn.append(torch.rand(()).item())
    return [*drawn, torch.rand(()).item()]


def _plain(batches: int, *, drawn_at_prepare: bool) -> list[float]:
    torch.manual_seed(0)
    if drawn_at_prepare:  # Accelerate seeds a shuffled sampler's new generator with it
        torch.empty((), dtype=torch.int64).random_()
    return _draws(DataLoader(TensorDataset(torch.arange(2.0 * batches)), batch_size=2))


def _prepared(config: DataLoaderConfiguration, **options: Any) -> tuple[list[float], int]:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    loader = accelerator.prepare(DataLoader(DATA, batch_size=2, **options))
    return _draws(loader), len(loader)


CASES: dict[str, tuple[DataLoaderConfiguration, dict[str, Any], bool]] = {
    "unshuffled": (DataLoaderConfiguration(), {}, False),
    "shuffled": (DataLoaderConfiguration(), {"shuffle": True}, True),
    "seedable_data_seed": (
        DataLoaderConfiguration(use_seedable_sampler=True, data_seed=5),
        {"shuffle": True},
        False,
    ),
}


def _resume(out: Path) -> dict[str, list[float]]:
    """Epoch 0, two batches of epoch 1, save_state inside the loop, the rest and epoch 2."""

    def prepared() -> tuple[Accelerator, Any]:
        torch.manual_seed(0)
        accelerator = Accelerator(cpu=True)
        return accelerator, accelerator.prepare(DataLoader(DATA, batch_size=2, shuffle=True))

    accelerator, loader = prepared()
    _draws(loader, epochs=1)
    uninterrupted = []
    for step, _ in enumerate(loader):
        if step == 2:
            accelerator.save_state(out / "state")
        if step >= 2:
            uninterrupted.append(torch.rand(()).item())
    uninterrupted += _draws(loader, epochs=1)

    accelerator, loader = prepared()
    accelerator.load_state(out / "state")
    resumed = [torch.rand(()).item() for _ in accelerator.skip_first_batches(loader, 2)]
    loader.set_epoch(2)  # the copy counted epoch 1; the loader itself goes on with epoch 2
    resumed += _draws(loader, epochs=1)
    return {"uninterrupted": uninterrupted, "resumed": resumed}


def main(out: Path) -> None:
    facts: dict[str, Any] = {}
    for name, (config, options, drawn_at_prepare) in CASES.items():
        drawn, batches = _prepared(config, **options)
        facts[name] = {
            "prepared": drawn,
            "plain": _plain(batches, drawn_at_prepare=drawn_at_prepare),
        }
    facts["resume"] = _resume(out)
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
