"""The error hierarchy of `trainer`.

Every error the framework raises on purpose derives from `TrainerError`. A message says
what is wrong, where (hook, argument, file, rank) and how to fix it, with the value received.
This module owns only the classes; the checks live next to the code they guard.
"""

from __future__ import annotations

__all__ = [
    "AnomalyError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "HookResultError",
    "MissingDependencyError",
    "StrategyError",
    "TrainerError",
]


class TrainerError(Exception):
    """Base class of every error raised by `trainer`."""


class ConfigurationError(TrainerError, ValueError):
    """An argument or a combination of arguments is invalid (constructor, config file, CLI)."""


class HookResultError(TrainerError, TypeError):
    """A user hook (``training_step``, ``configure_optimizers``, ...) returned something unusable."""


class AnomalyError(TrainerError, RuntimeError):
    """``detect_anomaly=True`` found a NaN or infinite value; the message names the hook."""


class CheckpointError(TrainerError):
    """A checkpoint is missing, corrupt, foreign, or could not be written."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError, ValueError):
    """A checkpoint path that does not exist (or no checkpoint to load). Also a
    ``FileNotFoundError``, as Lightning raises for a missing ``ckpt_path``, and a ``ValueError``,
    as Accelerate's ``load_state`` raises for a missing folder, so ported ``except`` clauses
    still catch it."""


class StrategyError(TrainerError, RuntimeError):
    """A strategy could not set up or run (process group, device, engine)."""


class MissingDependencyError(TrainerError, ImportError):
    """An optional package is needed by the feature in use; the message gives the pip extra."""


def describe(value: object) -> str:
    """Short ``repr`` plus type, for the "received" part of an error message."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {type(value).__name__})"
