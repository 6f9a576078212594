"""Warnings that point at the user's line, not at the framework's."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = ["warn_user"]

_PACKAGE = str(Path(__file__).resolve().parent)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside the ``trainer`` package."""
    # level 2: the caller of warn_user
    frame, level = sys._getframe(1), 2  # noqa: SLF001 - CPython's frame access, no public one
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
