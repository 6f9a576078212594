"""Parity by difference: what ``TensorBoardLogger`` leaves in its folder, on lightning.pytorch 2.6
and on trainer — every scalar point (tag, step, value) read back with TensorBoard's own reader,
``hparams.yaml`` (parsed) and the folder's other files. Lightning's run is the expected value.

Each scenario fits a regression module that logs on step and on epoch, validates each epoch,
then calls ``validate`` again, with ``TensorBoardLogger`` as the only logger.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet

pytest.importorskip("tensorboard")
yaml = pytest.importorskip("yaml")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def _module(fw: Any, recipe: str) -> Any:
    class Logged(fw.Module):  # type: ignore[misc, valid-type]
        def __init__(self, lr: float = 0.05, config: dict | None = None) -> None:
            super().__init__()
            if recipe == "hyperparameters":
                self.save_hyperparameters()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def loss(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log_dict({"group/batch": float(batch_idx), "epoch_seen": self.current_epoch})
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Logged(lr=0.05, config={"optimizer": {"name": "sgd", "momentum": 0.0}, "layers": [4]})


def _run(fw: Any, root: Path, recipe: str) -> dict[str, Any]:
    logger = fw.loggers.TensorBoardLogger(save_dir=str(root), name="tb")
    trainer = fw.trainer(**quiet(logger=logger, max_epochs=2, log_every_n_steps=2))
    module = _module(fw, recipe)
    trainer.fit(module, loader(10), loader(4))
    trainer.validate(module, loader(4), **fw.eval_options)
    log_dir = Path(logger.log_dir)
    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    scalars = {
        tag: [(event.step, round(event.value, 5)) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }
    names = sorted(os.listdir(log_dir))
    hparams_file = log_dir / "hparams.yaml"
    return {
        "folder": os.path.relpath(log_dir, root),
        "files": [name for name in names if not name.startswith("events.out.tfevents.")],
        "event_files": sum(name.startswith("events.out.tfevents.") for name in names),
        "scalars": scalars,
        "hparams.yaml": yaml.safe_load(hparams_file.read_text()) if hparams_file.exists() else None,
    }


@pytest.mark.parametrize("recipe", ["hyperparameters", "no_hyperparameters"])
def test_tensorboard_folder_equals_lightnings(tmp_path: Path, recipe: str) -> None:
    expected = _run(LIGHTNING, tmp_path / "lightning", recipe)
    actual = _run(TRAINER, tmp_path / "trainer", recipe)
    assert expected["scalars"]  # the scenario logged something to compare
    assert actual == expected
