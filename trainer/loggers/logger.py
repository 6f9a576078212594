"""The Logger base class: what the Trainer and the Accelerator call on an experiment tracker.

The Trainer calls loggers on global rank zero only, with plain Python floats (tensors are read
once, when the write happens). This module owns the interface; each backend is one file.
"""

from __future__ import annotations

import contextlib
import numbers
import operator
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from trainer.errors import ConfigurationError, describe

__all__ = [
    "BlankTracker",
    "Logger",
    "metric_as_float",
    "resolve_step",
    "split_tracker_values",
    "warn_dropped",
]


class Logger(ABC):
    """Base class of experiment trackers.

    Subclasses implement `log_metrics` and `log_hyperparams`, and the ``name`` /
    ``version`` properties; the rest has sensible defaults.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """The experiment name."""

    @property
    @abstractmethod
    def version(self) -> str | int | None:
        """The run's version (number or id)."""

    @property
    def save_dir(self) -> str | None:
        """Root directory the logger writes under, or None for remote-only loggers."""
        return None

    @property
    def log_dir(self) -> str | None:
        """Directory of this run's files, or None."""
        return None

    @property
    def experiment(self) -> Any:
        """The backend object (a writer, a run, ...)."""
        return None

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (name -> float) at global ``step``."""

    @abstractmethod
    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Record the run's hyperparameters."""

    def save(self) -> None:
        """Flush anything buffered to storage."""

    def finalize(self, status: str) -> None:
        """Close the run; ``status`` is "success", "failed" or "interrupted"."""
        self.save()

    def state_dict(self) -> dict[str, Any]:
        """The run's identity, saved in checkpoints so a resumed run continues the same run."""
        return {"name": self.name, "version": self.version}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the run recorded by `state_dict` (when the user did not pick one)."""

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called after a checkpoint is written (for artifact upload)."""

    # ---- Accelerate's tracker verbs: what code written for accelerator.get_tracker(...) calls
    @property
    def tracker(self) -> Any:
        """Accelerate's name for `experiment`: the backend object (writer, run, client)."""
        return self.experiment

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Accelerate's ``tracker.log``: numbers (and one-element tensors, read) go to
        `log_metrics` (``step`` None: one past this tracker's last step); any other value is
        dropped with a warning naming its key, as Accelerate's MLflow tracker drops it (the
        CSV, TensorBoard and W&B loggers take more). ``kwargs`` are not used."""
        metrics, others = split_tracker_values(values)
        for key, value in others.items():
            warn_dropped(type(self).__name__, key, value)
        self.log_metrics(metrics, step)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Accelerate's name for `log_hyperparams`."""
        self.log_hyperparams(dict(values))

    def finish(self) -> None:
        """Accelerate's name for ``finalize("success")``."""
        self.finalize("success")


class BlankTracker:
    """What ``accelerator.get_tracker`` returns where no tracker runs (the other processes, or
    before ``init_trackers``), as Accelerate's blank tracker: every call does nothing, and it
    has no backend object (``.tracker`` raises AttributeError, as Accelerate's)."""

    name = None

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Nothing to log to."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Nothing to store in."""

    def finish(self) -> None:
        """Nothing to finish."""


def split_tracker_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` of an Accelerate-style ``log`` as (numbers, everything else); one-element
    tensors and numpy scalars are read as numbers."""
    metrics, others = {}, {}
    for key, value in values.items():
        if isinstance(value, numbers.Real):
            metrics[key] = value
        elif hasattr(value, "item") and _size(value) == 1:
            metrics[key] = value.item()
        else:
            others[key] = value
    return metrics, others


def _size(value: Any) -> int | None:
    numel = getattr(value, "numel", None)
    return numel() if callable(numel) else getattr(value, "size", None)


def warn_dropped(owner: str, key: str, value: Any, keeps: str = "numbers") -> None:
    """Warn that ``owner``'s Accelerate-style ``log`` does not store ``value`` under ``key``
    (it stores ``keeps``)."""
    warnings.warn(
        f"{owner}.log: {key!r} is {describe(value)}, which this tracker does not store (it "
        f"keeps {keeps}); dropped.",
        stacklevel=3,
    )


def metric_as_float(owner: str, key: str, value: Any) -> float:
    """``value`` as a plain float (one-element tensors included), for backends storing numbers.

    Raises:
        ConfigurationError: naming ``owner`` and ``key`` when ``value`` is not a scalar.
    """
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ConfigurationError(
            f"{owner} expected metric {key!r} to be a number or a one-element tensor, "
            f"received {describe(value)}. Log a scalar, e.g. loss.item() or x.mean()."
        ) from err


def resolve_step(owner: str, step: Any, last_step: int | None) -> int:
    """The step a row is logged at: ``step`` as an int, or one past ``last_step`` when None.

    Checked at the call, so a bad value fails there and not later in a backend's writer.

    Raises:
        ConfigurationError: naming ``owner`` when ``step`` is not an int (a bool is not).
    """
    if step is None:
        return 0 if last_step is None else last_step + 1
    if not isinstance(step, bool):
        with contextlib.suppress(TypeError, RuntimeError):
            return operator.index(step)
    raise ConfigurationError(
        f"{owner}.log_metrics expected step to be an int, received {describe(step)}. "
        f"Pass the global step, e.g. step=trainer.global_step."
    )
