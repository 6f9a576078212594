"""Durations as Lightning takes them: ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of its fields.

One parser for ``Trainer(max_time=)``, ``Trainer(val_check_interval=)`` (time-based validation)
and ``Timer(duration=)``; each error names the argument it was given to.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["is_duration", "parse_duration", "val_check_seconds"]

_DD_HH_MM_SS = re.compile(r"(\d+):(\d+):(\d+):(\d+)")


def is_duration(value: object) -> bool:
    """Whether ``value`` is given as a duration (a str, timedelta or dict), not a number."""
    return isinstance(value, str | dt.timedelta | dict)


def parse_duration(argument: str, value: object, *, allow_zero: bool = True) -> dt.timedelta:
    """``"DD:HH:MM:SS"`` (``"00:12:00:00"``: 12 hours), a timedelta or ``{"hours": 12}`` ->
    a timedelta (never negative; zero only with ``allow_zero``).

    Args:
        argument: what the value was given to, for the error (``"Trainer(max_time=...)"``
            reads ``"Trainer(max_time"``).
        value: the user's value.
        allow_zero: whether a zero duration is accepted (``max_time``: stop at once).

    Raises:
        ConfigurationError: another type, a string not of four ``:``-separated integers, a dict
            with keys that are not timedelta fields, or a negative (or unwanted zero) duration.
    """
    expected = "'DD:HH:MM:SS' (e.g. '00:12:00:00' for 12 hours), a timedelta or a dict"
    duration = value
    if isinstance(value, str):
        match = _DD_HH_MM_SS.fullmatch(value.strip())
        if match is None:
            raise ConfigurationError(f"{argument}={describe(value)}): expected {expected}.")
        days, hours, minutes, seconds = map(int, match.groups())
        duration = dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(value, dict):
        try:
            duration = dt.timedelta(**value)
        except TypeError as err:
            raise ConfigurationError(
                f"{argument}={describe(value)}): the keys must be timedelta fields (days, hours, "
                "minutes, seconds, milliseconds, ...), e.g. {'hours': 12}."
            ) from err
    if not isinstance(duration, dt.timedelta):
        raise ConfigurationError(f"{argument}={describe(value)}): expected {expected}.")
    if duration < dt.timedelta(0) or (duration == dt.timedelta(0) and not allow_zero):
        least = "zero or more" if allow_zero else "above zero"
        raise ConfigurationError(f"{argument}={describe(value)}): expected a duration {least}.")
    return duration


def val_check_seconds(trainer: Trainer) -> float | None:
    """Seconds between validations when ``val_check_interval`` is a duration, else None.

    Lightning 2.6's time-based validation: after the first training batch that ends at least
    that long after training started or the last validation ended (the epoch's end is not
    special), within the epochs ``check_val_every_n_epoch`` allows.
    """
    interval = trainer.val_check_interval
    return interval.total_seconds() if isinstance(interval, dt.timedelta) else None
