"""Build trackers from ``Accelerator(log_with=...)`` names (``LoggerType`` or str) or instances.

Each backend is imported only when named, so an unused tracker costs nothing. Where each one
writes, for ``init_trackers(project_name)`` with the Accelerator's ``logging_dir`` (``"."`` when
None): csv and tensorboard in ``<logging_dir>/<project_name>/version_<N>/``, wandb in
``<logging_dir>/wandb/`` (project ``project_name``), mlflow in the file store
``<logging_dir>/mlruns`` (experiment ``project_name``). TensorBoard gets
``default_hp_metric=False``: as in Accelerate, the config is written without a placeholder
``hp_metric``. ``init_kwargs[name]`` are passed to that
logger's constructor and override these choices (e.g. ``{"mlflow": {"tracking_uri": ...}}``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from trainer._imports import is_available
from trainer.errors import ConfigurationError, describe
from trainer.loggers.logger import Logger

__all__ = ["TRACKER_NAMES", "available_trackers", "build_trackers", "check_log_with"]

TRACKER_NAMES = ("csv", "tensorboard", "wandb", "mlflow")
# The package each tracker needs ("all" starts only the ones installed).
_PACKAGES = {"csv": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def available_trackers() -> list[str]:
    """The tracker names whose package is installed (what ``log_with="all"`` starts)."""
    return [
        name for name in TRACKER_NAMES if _PACKAGES[name] is None or is_available(_PACKAGES[name])
    ]


def check_log_with(log_with: Any) -> Any:
    """``log_with`` itself, once every entry names a tracker or is a Logger: an unknown name is
    refused when the Accelerator is built (as Accelerate's ``ValueError``), not at
    ``init_trackers``. Nothing is imported.

    Raises:
        ConfigurationError: an entry that is neither a tracker name, "all", nor a Logger.
    """
    entries = (
        [] if log_with is None else log_with if isinstance(log_with, list | tuple) else [log_with]
    )
    for entry in entries:
        if not isinstance(entry, Logger) and str(entry).lower() not in (*_BUILDERS, "all"):
            raise ConfigurationError(
                f"log_with={describe(entry)} is not an available tracker. Expected one of "
                f"{(*TRACKER_NAMES, 'all')}, a LoggerType, or a trainer.loggers.Logger instance."
            )
    return log_with


def build_trackers(
    log_with: Any,
    *,
    project_name: str,
    logging_dir: str | os.PathLike[str] | None,
    init_kwargs: dict[str, dict[str, Any]],
) -> list[Logger]:
    """Return one Logger per entry of ``log_with`` (None -> none, "all" -> every available)."""
    if log_with is None:
        return []
    entries = log_with if isinstance(log_with, list | tuple) else [log_with]
    names: list[Any] = []
    for entry in entries:
        names.extend(available_trackers() if str(entry).lower() == "all" else [entry])
    check_log_with(names)
    trackers: list[Logger] = []
    for entry in names:
        if isinstance(entry, Logger):
            trackers.append(entry)
            continue
        name = str(entry).lower()
        directory = os.fspath(logging_dir) if logging_dir is not None else "."
        trackers.append(_BUILDERS[name](project_name, directory, dict(init_kwargs.get(name, {}))))
    return trackers


def _csv(project_name: str, directory: str, kwargs: dict[str, Any]) -> Logger:
    from trainer.loggers.csv_logs import CSVLogger

    return CSVLogger(**{"save_dir": directory, "name": project_name, **kwargs})


def _tensorboard(project_name: str, directory: str, kwargs: dict[str, Any]) -> Logger:
    from trainer.loggers.tensorboard import TensorBoardLogger

    # Accelerate's tracker writes no placeholder metric with the config.
    defaults = {"save_dir": directory, "name": project_name, "default_hp_metric": False}
    return TensorBoardLogger(**{**defaults, **kwargs})


def _wandb(project_name: str, directory: str, kwargs: dict[str, Any]) -> Logger:
    from trainer.loggers.wandb import WandbLogger

    return WandbLogger(**{"project": project_name, "save_dir": directory, **kwargs})


def _mlflow(project_name: str, directory: str, kwargs: dict[str, Any]) -> Logger:
    from trainer.loggers.mlflow import MLFlowLogger

    save_dir = os.path.join(directory, "mlruns")
    return MLFlowLogger(**{"experiment_name": project_name, "save_dir": save_dir, **kwargs})


_BUILDERS: dict[str, Callable[[str, str, dict[str, Any]], Logger]] = {
    "csv": _csv,
    "tensorboard": _tensorboard,
    "wandb": _wandb,
    "mlflow": _mlflow,
}
