"""What the parity scenarios build on either side: Lightning 2.6's classes or trainer's, by name.

A scenario writes its module, callbacks and run once against `Framework` and runs it for both;
Lightning's run is the expected value. Imported by the parity tests only (the suite skips when
lightning is not installed).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

pl = pytest.importorskip("lightning.pytorch")


@dataclass(frozen=True)
class Framework:
    """One side of a comparison: the classes a scenario needs, and the options it always passes."""

    name: str
    Module: type
    Callback: type
    Trainer: type
    callbacks: Any  # the callbacks package (EarlyStopping, ModelCheckpoint, ...)
    loggers: Any
    trainer_options: dict[str, Any]
    eval_options: dict[str, Any]  # validate() / test() keywords

    def trainer(self, **options: Any) -> Any:
        return self.Trainer(**self.trainer_options, **options)


LIGHTNING = Framework(
    "lightning",
    pl.LightningModule,
    pl.Callback,
    pl.Trainer,
    pl.callbacks,
    pl.loggers,
    {"accelerator": "cpu"},
    {"verbose": False},
)
TRAINER = Framework(
    "trainer",
    trainer.TrainModule,
    trainer.callbacks.Callback,
    trainer.Trainer,
    trainer.callbacks,
    trainer.loggers,
    {},
    {},
)
BOTH = (LIGHTNING, TRAINER)


def quiet(**options: Any) -> dict[str, Any]:
    """No logger, checkpoints, bar or summary unless a scenario asks for them."""
    return {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **options,
    }


def dataset(n: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def loader(n: int, seed: int = 0, batch_size: int = 2, shuffle: bool = False) -> DataLoader:
    return DataLoader(dataset(n, seed), batch_size=batch_size, shuffle=shuffle)


def regression(base: type, calls: list[Any] | None = None) -> type:
    """A linear regression module, seeded, that logs ``val_loss`` in ``validation_step``."""

    class Regression(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def loss(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def training_step(self, batch, batch_idx):
            if calls is not None:
                calls.append("m:training_step")
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            if calls is not None:
                calls.append("m:validation_step")
            self.log("val_loss", self.loss(batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regression


def validated(base: type, net: Callable[[], torch.nn.Module], losses: list[float]) -> Any:
    """A regression module over ``net()`` (built after ``manual_seed(0)``), SGD at 0.05, that
    appends each validation loss to ``losses`` and logs it as ``val_loss``."""

    class Validated(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            losses.append(round(float(loss), 6))
            self.log("val_loss", loss)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Validated()


def recording_callback(base: type, calls: list[Any], hooks: tuple[str, ...]) -> Any:
    """A callback appending ``(hook, current_epoch, global_step, *int arguments)`` to ``calls``."""

    def record(name: str) -> Callable[..., None]:
        def hook(self, trainer_, module, *args: Any) -> None:
            numbers = tuple(a for a in args if isinstance(a, int) and not isinstance(a, bool))
            calls.append((name, trainer_.current_epoch, trainer_.global_step, *numbers))

        return hook

    return type("Recording", (base,), {name: record(name) for name in hooks})()


def snapshot(metrics: dict[str, Any]) -> dict[str, float]:
    return {key: round(float(value), 5) for key, value in sorted(metrics.items())}


def csv_cells(log_dir: str) -> list[tuple[str, int, float]]:
    """Every non-empty cell of ``metrics.csv`` as ``(key, step, value)``, sorted."""
    with open(os.path.join(log_dir, "metrics.csv"), newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return sorted(
        (key, int(row["step"]), round(float(value), 5))
        for row in rows
        for key, value in row.items()
        if key != "step" and value not in ("", None)
    )


def rows_logger(fw: Framework) -> Any:
    """A logger of ``fw`` keeping every ``(step, metrics)`` row it is sent, in ``.rows``."""
    base = pl.loggers.Logger if fw is LIGHTNING else TRAINER.loggers.Logger

    class Rows(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, dict[str, float]]] = []

        @property
        def name(self) -> str:
            return "rows"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, dict(metrics)))

        def log_hyperparams(self, *args, **kwargs):
            pass

    return Rows()
