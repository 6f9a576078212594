"""Checks and resolves the Trainer's constructor arguments (kept out of ``Trainer.__init__``).

Each function takes raw user values and returns resolved ones, or raises ConfigurationError naming
the argument, the value received and the fix.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe

__all__ = ["check_positive_int", "parse_max_time", "resolve_device", "resolve_limit"]


def _fail(argument: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"Trainer({argument}={describe(value)}): expected {expected}.")


def check_positive_int(argument: str, value: Any, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(argument, value, f"an int >= {low}")
    return value


def parse_max_time(value: str | dt.timedelta | dict[str, int] | None) -> dt.timedelta | None:
    """``"DD:HH:MM:SS"``, a timedelta or a dict of timedelta fields -> timedelta."""
    if value is None or isinstance(value, dt.timedelta):
        return value
    if isinstance(value, dict):
        try:
            return dt.timedelta(**value)
        except TypeError as err:
            raise _fail("max_time", value, "timedelta keywords like {'hours': 1}") from err
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) == 4 and all(p.isdigit() for p in parts):
            days, hours, minutes, seconds = map(int, parts)
            return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise _fail("max_time", value, "'DD:HH:MM:SS' (e.g. '00:12:00:00'), a timedelta or a dict")


def resolve_limit(argument: str, value: int | float | None, length: float) -> float:
    """How many batches ``limit_*_batches`` keeps of a loader of ``length`` batches."""
    if value is None:
        return length
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _fail(argument, value, "None, an int number of batches, or a float in [0.0, 1.0]")
    if isinstance(value, int):
        return min(value, length)
    if value > 1.0:
        raise _fail(argument, value, "a float fraction in [0.0, 1.0], or an int number of batches")
    if math.isinf(length):
        if value == 1.0:
            return length
        raise _fail(argument, value, "an int when the dataloader has no length")
    return int(length * value) if value < 1.0 else length


def resolve_device(accelerator: str, devices: Any) -> torch.device:
    """The one device a single-process run uses, from ``accelerator`` and ``devices``."""
    kinds = ("auto", "cpu", "cuda", "gpu", "mps")
    if accelerator not in kinds:
        raise _fail("accelerator", accelerator, f"one of {kinds}")
    if accelerator == "auto":
        if torch.cuda.is_available():
            accelerator = "cuda"
        elif torch.backends.mps.is_available():
            accelerator = "mps"
        else:
            accelerator = "cpu"
    accelerator = "cuda" if accelerator == "gpu" else accelerator
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError(
            "Trainer(accelerator='cuda'): no CUDA device is available on this machine. "
            "Use accelerator='cpu' or 'auto'."
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigurationError("Trainer(accelerator='mps'): MPS is not available. Use 'cpu'.")
    index = 0
    if isinstance(devices, list | tuple) and len(devices) == 1:
        index = int(devices[0])
    elif devices in ("auto", 1, "1", -1, None) or (
        isinstance(devices, list | tuple) and not devices
    ):
        index = 0
    else:
        raise ConfigurationError(
            f"Trainer(devices={describe(devices)}): one process uses one device. For several "
            "devices choose a multi-process strategy (strategy='ddp' or 'fsdp') and start it "
            "with `trainer launch`."
        )
    if accelerator == "cpu":
        return torch.device("cpu")
    return torch.device(accelerator, index) if accelerator == "cuda" else torch.device(accelerator)
