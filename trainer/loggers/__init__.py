"""Experiment trackers: receive the same metric names, values and steps from Trainer or Accelerator.

Backends are imported on first use, so ``import trainer`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer.loggers.logger import Logger

if TYPE_CHECKING:
    from trainer.loggers.csv_logs import CSVLogger

__all__ = ["CSVLogger", "Logger"]

_LAZY = {"CSVLogger": "trainer.loggers.csv_logs"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.loggers' has no attribute {name!r}")
