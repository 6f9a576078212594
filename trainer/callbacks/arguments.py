"""Checks of callback constructor arguments, and the error that names a bad one."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe

__all__ = ["bad_argument", "check_device", "is_int", "is_number"]


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    """An int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def bad_argument(owner: str, name: str, value: Any, expected: str) -> ConfigurationError:
    """The error for a bad constructor argument: names it, shows the value, says what fits."""
    return ConfigurationError(f"{owner}({name}={describe(value)}): expected {expected}.")


def check_device(owner: str, device: Any) -> torch.device | None:
    """``device`` as a torch.device (None stays None).

    Raises:
        ConfigurationError: torch does not know it as a device, naming ``owner``'s argument.
    """
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise bad_argument(
            owner, "device", device, "a torch.device, 'cpu', 'cuda:0' or None"
        ) from err
