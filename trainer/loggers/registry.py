"""Build trackers from ``Accelerator(log_with=...)`` names (``LoggerType`` or str) or instances.

Each backend is imported only when named, so an unused tracker costs nothing.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.errors import ConfigurationError, describe
from trainer.loggers.logger import Logger

__all__ = ["TRACKER_NAMES", "build_trackers"]

TRACKER_NAMES = ("csv",)


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
        names.extend(TRACKER_NAMES if str(entry) == "all" else [entry])
    trackers: list[Logger] = []
    for entry in names:
        if isinstance(entry, Logger):
            trackers.append(entry)
            continue
        name = str(entry).lower()
        kwargs = init_kwargs.get(name, {})
        if name == "csv":
            from trainer.loggers.csv_logs import CSVLogger

            trackers.append(CSVLogger(save_dir=logging_dir or ".", name=project_name, **kwargs))
        else:
            raise ConfigurationError(
                f"log_with={describe(entry)} is not an available tracker. Expected one of "
                f"{(*TRACKER_NAMES, 'all')} or a trainer.loggers.Logger instance."
            )
    return trackers
