"""Experiment trackers: receive the same metric names, values and steps from Trainer or Accelerator.

Backends are imported on first use, so ``import trainer`` stays cheap: ``trainer.loggers`` loads
only the Logger base here; ``from trainer.loggers import WandbLogger`` loads ``loggers/wandb.py``
(which itself imports wandb only when the run starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer.loggers.logger import Logger

if TYPE_CHECKING:
    from trainer.loggers.csv_logs import CSVLogger
    from trainer.loggers.dummy import DummyLogger
    from trainer.loggers.mlflow import MLFlowLogger
    from trainer.loggers.tensorboard import TensorBoardLogger
    from trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "DummyLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]

_LAZY = {
    "CSVLogger": "trainer.loggers.csv_logs",
    "DummyLogger": "trainer.loggers.dummy",
    "MLFlowLogger": "trainer.loggers.mlflow",
    "TensorBoardLogger": "trainer.loggers.tensorboard",
    "WandbLogger": "trainer.loggers.wandb",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.loggers' has no attribute {name!r}")
