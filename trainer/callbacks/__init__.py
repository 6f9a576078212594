"""Callbacks: observe the Trainer through its public attributes and hooks only.

Classes are imported on first use, so ``import trainer`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from trainer.callbacks.model_checkpoint import ModelCheckpoint, OnExceptionCheckpoint
    from trainer.callbacks.model_summary import ModelSummary
    from trainer.callbacks.progress import RichProgressBar

__all__ = [
    "Callback",
    "ModelCheckpoint",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "RichProgressBar",
]

_LAZY = {
    "ModelCheckpoint": "trainer.callbacks.model_checkpoint",
    "OnExceptionCheckpoint": "trainer.callbacks.model_checkpoint",
    "ModelSummary": "trainer.callbacks.model_summary",
    "RichProgressBar": "trainer.callbacks.progress",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.callbacks' has no attribute {name!r}")
