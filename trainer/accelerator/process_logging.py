"""get_logger: Accelerate's multi-process logger, so ported ``logger.info(...)`` calls keep working.

A `logging.LoggerAdapter` over ``logging.getLogger(name)`` whose calls take two more keywords:
``main_process_only`` (default True: only process 0 writes) and ``in_order`` (every process writes,
one after the other). Messages are prefixed with ``[RANK i]``, as Accelerate's are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import Any

from trainer.runtime.state import PartialState

__all__ = ["ProcessLoggerAdapter", "get_logger"]


class ProcessLoggerAdapter(logging.LoggerAdapter):
    """A logger whose calls take ``main_process_only=True`` and ``in_order=False``.

    ``in_order=True`` makes every process log, rank by rank, waiting for the others between
    (a collective: every process must make the call); ``main_process_only`` is then ignored.
    """

    def __init__(self, logger: logging.Logger, extra: Any = None) -> None:
        super().__init__(logger, extra or {})
        self._warned: set[Any] = set()  # warning_once's messages

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        # The caller's line: logging skips its own frames (LoggerAdapter.info, ...), not ours.
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        state = PartialState()
        msg, kwargs = self.process(msg, kwargs)
        if not in_order:
            if state.is_main_process or not main_process_only:
                self.logger.log(level, msg, *args, **kwargs)
            return
        for rank in range(state.num_processes):
            if rank == state.process_index:
                self.logger.log(level, msg, *args, **kwargs)
            state.wait_for_everyone()

    def warning_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """``warning``, once per distinct message and arguments for this logger."""
        key = (str(msg), args, tuple(sorted(kwargs.items())))
        if key not in self._warned:
            self._warned.add(key)
            self.warning(msg, *args, **{"stacklevel": 3, **kwargs})


def get_logger(name: str, log_level: str | None = None) -> ProcessLoggerAdapter:
    """``logging.getLogger(name)`` behind a `ProcessLoggerAdapter` (Accelerate's ``get_logger``).

    ``log_level`` (e.g. "DEBUG"), else the ``ACCELERATE_LOG_LEVEL`` environment variable when
    set, becomes the named logger's level (Accelerate also sets the root logger's; here only
    this one changes).

    Examples:
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> logger.info("on process 0 only")
        >>> logger.info("on every process", main_process_only=False)
    """
    level = log_level if log_level is not None else os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if level is not None:
        logger.setLevel(level.upper())
    return ProcessLoggerAdapter(logger, {})
