"""The error hierarchy of `trainer`.

Every error the framework raises on purpose derives from `TrainerError`. A message says
what is wrong, where (hook, argument, file, rank) and how to fix it, with the value received.
This module owns the classes and two helpers for messages; the checks live next to the code
they guard.
"""

from __future__ import annotations

__all__ = [
    "AnomalyError",
    "CheckpointError",
    "CheckpointMismatchError",
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


class CheckpointMismatchError(CheckpointError, RuntimeError):
    """A checkpoint's weights do not fit the model they are loaded into (missing, unexpected or
    differently shaped tensors). Also a ``RuntimeError``, as torch's ``load_state_dict`` raises
    there (Lightning and Accelerate let it through), so ported ``except`` clauses still catch it."""


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


def summarize_error(err: BaseException, limit: int = 200) -> str:
    """``"TypeName: first line of the message"`` (cut to ``limit`` characters), or the type name
    alone when the message is empty (``torch.load`` of a 0-byte file raises a bare EOFError)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:limit]}" if lines else type(err).__name__
