"""Parity by difference: what LearningRateMonitor logs, on lightning.pytorch 2.6 and on trainer.

Each scenario runs one module recipe with one LearningRateMonitor on both frameworks, each with
its own CSVLogger, and compares every ``lr-*`` cell of ``metrics.csv`` (key, step, value), the
monitor's ``lrs``, and the ``lr-*`` values in ``trainer.callback_metrics`` at each epoch end,
where ModelCheckpoint and EarlyStopping read them. Lightning's run is the expected value.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

pl = pytest.importorskip("lightning.pytorch")


def _loader(n: int = 12) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)


def _module(base: type, recipe: str) -> Any:
    class Scheduled(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 1)
            if recipe == "manual":
                self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.head(self.body(x)), y)
            if recipe != "manual":
                return loss
            for optimizer in self.optimizers():
                optimizer.zero_grad()
                self.manual_backward(torch.nn.functional.mse_loss(self.head(self.body(x)), y))
                optimizer.step()
            for scheduler in self.lr_schedulers():
                scheduler.step()
            return None

        def configure_optimizers(self):
            if recipe == "manual":
                first = torch.optim.SGD(self.body.parameters(), lr=0.1)
                second = torch.optim.Adam(self.head.parameters(), lr=0.01)
                schedulers = [
                    torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) for opt in (first, second)
                ]
                return [first, second], schedulers
            groups = [
                {"params": self.body.parameters()},
                {"params": self.head.parameters(), "lr": 0.01, "name": "head"},
            ]
            if recipe == "duplicate-names":
                groups[0]["name"] = "head"
            optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=0.01)
            interval = "step" if recipe == "step" else "epoch"
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": interval},
            }

    return Scheduled()


def _lr_cells(log_dir: str) -> list[tuple[str, int, float]]:
    with open(os.path.join(log_dir, "metrics.csv"), newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return sorted(
        {
            (key, int(row["step"]), round(float(value), 6))
            for row in rows
            for key, value in row.items()
            if key.startswith("lr-") and value not in ("", None)
        }
    )


def _run(framework: str, root: Path, recipe: str, monitor_options: dict[str, Any], **options: Any):
    options = {
        "max_epochs": 3,
        "log_every_n_steps": 2,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **options,
    }
    at_epoch_end: list[dict[str, float]] = []

    def record(trainer_: Any, module: Any) -> None:
        metrics = trainer_.callback_metrics
        at_epoch_end.append(
            {k: round(float(v), 6) for k, v in metrics.items() if k.startswith("lr-")}
        )

    if framework == "lightning":
        monitor = pl.callbacks.LearningRateMonitor(**monitor_options)
        recorder = pl.callbacks.LambdaCallback(on_train_epoch_end=record)
        logger = pl.loggers.CSVLogger(str(root), name="run", version=0)
        fit = pl.Trainer(logger=logger, callbacks=[monitor, recorder], accelerator="cpu", **options)
        module = _module(pl.LightningModule, recipe)
    else:
        monitor = trainer.callbacks.LearningRateMonitor(**monitor_options)
        recorder = trainer.callbacks.LambdaCallback(on_train_epoch_end=record)
        logger = trainer.loggers.CSVLogger(str(root), name="run", version=0)
        fit = trainer.Trainer(logger=logger, callbacks=[monitor, recorder], **options)
        module = _module(trainer.TrainModule, recipe)
    fit.fit(module, _loader())
    lrs = {name: [round(v, 6) for v in values] for name, values in monitor.lrs.items() if values}
    return {"csv": _lr_cells(logger.log_dir), "lrs": lrs, "callback_metrics": at_epoch_end}


@pytest.mark.parametrize(
    ("recipe", "monitor_options", "options"),
    [
        ("epoch", {"log_momentum": True, "log_weight_decay": True}, {}),
        ("step", {}, {"accumulate_grad_batches": 2, "log_every_n_steps": 1}),
        ("step", {"logging_interval": "epoch"}, {}),  # "epoch" logs every scheduler there
        ("epoch", {"logging_interval": "step"}, {}),  # and "step" every scheduler per step
        ("manual", {}, {"log_every_n_steps": 1}),  # rows at the loggers' step, as Lightning
    ],
    ids=["epoch-groups-momentum", "step-accumulation", "interval-epoch", "interval-step", "manual"],
)
def test_logged_rows_and_lrs_match_lightning(
    tmp_path: Path, recipe: str, monitor_options: dict[str, Any], options: dict[str, Any]
) -> None:
    expected = _run("lightning", tmp_path / "lightning", recipe, monitor_options, **options)
    assert expected["csv"], "Lightning logged no learning rate: the scenario is wrong"
    received = _run("trainer", tmp_path / "trainer", recipe, monitor_options, **options)
    assert received["csv"] == expected["csv"]
    assert received["lrs"] == expected["lrs"]


def test_rates_reach_callback_metrics(tmp_path: Path) -> None:
    options = {"log_momentum": True}
    expected = _run("lightning", tmp_path / "lightning", "epoch", options)
    received = _run("trainer", tmp_path / "trainer", "epoch", options)
    assert (
        expected["callback_metrics"][0]
        and received["callback_metrics"] == expected["callback_metrics"]
    )


def test_duplicate_param_group_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="identical `name` values"):
        _run("lightning", tmp_path / "lightning", "duplicate-names", {})
    with pytest.raises(trainer.ConfigurationError, match="identical `name` values.*head"):
        _run("trainer", tmp_path / "trainer", "duplicate-names", {})
