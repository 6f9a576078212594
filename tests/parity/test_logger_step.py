"""Parity by difference: the step at which ``self.log`` rows land in the loggers, on
lightning.pytorch 2.6 and on trainer, when it is not ``global_step``.

Lightning writes training rows at its count of batches that stepped (``_batches_that_stepped``),
not at ``global_step``: under manual optimization every batch counts once, however many
optimizers it stepped (two optimizers: ``global_step`` grows twice as fast), even one that
stepped none. Each scenario fits a GAN-like module with two manually stepped optimizers, with
validation inside the epoch and a ``test()`` after, and compares every ``metrics.csv`` cell
(key, step, value), ``global_step`` and the weights. And ``log_every_n_steps=0``: no training
step rows at all (not even for the batch that stops the fit), no per-step learning rates.
Lightning's run is the expected value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.frameworks import LIGHTNING, TRAINER, csv_cells, loader, quiet


def _module(fw: Any, recipe: str) -> Any:
    class TwoOptimizers(fw.Module):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 1)
            self.automatic_optimization = False

        def loss(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.head(self.body(x)), y)

        def training_step(self, batch, batch_idx):
            first, second = self.optimizers()
            steppers = [first, second]
            if recipe == "uneven":  # the second optimizer every other batch, none on batch 3
                steppers = [] if batch_idx == 3 else [first] if batch_idx % 2 else steppers
            for optimizer in steppers:
                optimizer.zero_grad()
                loss = self.loss(batch)
                self.manual_backward(loss)
                optimizer.step()
            self.log("train_loss", self.loss(batch), on_step=True, on_epoch=True)
            self.log("seen_step", float(self.global_step))

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch))
            self.log("val_both", self.loss(batch), on_step=True, on_epoch=True)

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch))

        def on_train_epoch_end(self):
            self.log("epoch_end", float(self.current_epoch))

        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.body.parameters(), lr=0.1),
                torch.optim.Adam(self.head.parameters(), lr=0.01),
            ]

    return TwoOptimizers()


def _run(fw: Any, root: Path, recipe: str, **options: Any) -> dict[str, Any]:
    logger = fw.loggers.CSVLogger(str(root), name="run", version=0)
    options = quiet(logger=logger, **{"max_epochs": 2, "log_every_n_steps": 2, **options})
    fit = fw.trainer(**options)
    module = _module(fw, recipe)
    fit.fit(module, loader(12), loader(4, seed=1))
    fit.test(module, loader(4, seed=2), **fw.eval_options)
    weights = [round(v, 5) for v in module.head.weight.detach().flatten().tolist()]
    return {"csv": csv_cells(logger.log_dir), "global_step": fit.global_step, "weights": weights}


@pytest.mark.parametrize(
    ("recipe", "options"),
    [
        ("both", {}),
        ("both", {"val_check_interval": 0.5}),
        ("uneven", {"val_check_interval": 2, "log_every_n_steps": 3}),
    ],
    ids=["two optimizers", "two optimizers, validation mid-epoch", "uneven steps"],
)
def test_manual_rows_land_at_lightning_steps(
    tmp_path: Path, recipe: str, options: dict[str, Any]
) -> None:
    expected = _run(LIGHTNING, tmp_path / "lightning", recipe, **options)
    assert expected["global_step"] > 12, "the scenario should step more than once per batch"
    assert _run(TRAINER, tmp_path / "trainer", recipe, **options) == expected


# ---- log_every_n_steps=0: no step rows ---------------------------------------------------------
def _no_step_rows(fw: Any, root: Path) -> dict[str, Any]:
    class Stops(fw.Module):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            if (self.current_epoch, batch_idx) == (1, 2):
                self.trainer.should_stop = True  # the stopping batch has a row unless n is 0
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 2)]

    logger = fw.loggers.CSVLogger(str(root), name="run", version=0)
    monitor = fw.callbacks.LearningRateMonitor(logging_interval="step")
    fit = fw.trainer(callbacks=[monitor], **quiet(logger=logger, max_epochs=3, log_every_n_steps=0))
    fit.fit(Stops(), loader(12), loader(4, seed=1))
    return {"csv": csv_cells(logger.log_dir), "global_step": fit.global_step}


def test_log_every_n_steps_zero_writes_no_step_rows(tmp_path: Path) -> None:
    # trainer refused 0 (an int >= 1); Lightning accepts it: epoch rows only, no lr rows
    expected = _no_step_rows(LIGHTNING, tmp_path / "lightning")
    assert expected["csv"] and not any(key.endswith("_step") for key, _, _ in expected["csv"])
    assert _no_step_rows(TRAINER, tmp_path / "trainer") == expected
