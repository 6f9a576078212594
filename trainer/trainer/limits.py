"""Checks and resolves the Trainer's counting arguments: how many batches, steps and epochs.

``limit_*_batches`` / ``overfit_batches`` (`resolve_limit` at each loader, `check_overfit_batches`
in the constructor), ``accumulate_grad_batches``, ``min_epochs`` / ``min_steps``,
``val_check_interval`` and ``num_sanity_val_steps``, each accepted as Lightning 2.6 accepts it.
Each function takes raw user values and returns resolved ones, or raises ConfigurationError
naming the argument, the value received and the fix. The loops that use the values are not here;
`trainer.trainer.options` re-exports these for the Trainer's constructor.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import ROUND_CEILING, Decimal
from typing import Any

from trainer.errors import ConfigurationError, describe
from trainer.trainer.durations import is_duration, parse_duration

__all__ = [
    "check_accumulation",
    "check_min_limits",
    "check_overfit_batches",
    "check_sanity_steps",
    "check_val_interval",
    "resolve_limit",
    "smallest_fraction",
]


def _fail(argument: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"Trainer({argument}={describe(value)}): expected {expected}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def smallest_fraction(length: int) -> float:
    """The smallest fraction (rounded up to two significant digits) that keeps one of ``length``
    batches: 10 -> 0.1, 3 -> 0.34, 49 -> 0.021."""
    exact = Decimal(1) / Decimal(length)
    fraction = float(exact.quantize(Decimal(1).scaleb(exact.adjusted() - 1), ROUND_CEILING))
    while int(length * fraction) < 1:  # float rounding of the product: one ulp up
        fraction = math.nextafter(fraction, 1.0)
    return fraction


def resolve_limit(argument: str, value: int | float | None, length: float, loader: str) -> float:
    """How many batches ``limit_*_batches`` keeps of a loader of ``length`` batches.

    Args:
        argument: the Trainer argument that set ``value`` (``limit_val_batches``,
            ``overfit_batches``), for messages.
        value: None (all), an int count or a float fraction; 0 and 0.0 keep none, on purpose.
        length: the loader's batches (``inf`` without a length).
        loader: the loader, for messages, e.g. "train_dataloader".

    Raises:
        ConfigurationError: a negative value, a float above 1.0, a fraction other than 1.0 of a
            loader without length, or a fraction that keeps less than one batch (Lightning's:
            0.05 of 10 batches is 0.5; the message gives the smallest fraction that keeps one).
    """
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
    kept = int(length * value) if value < 1.0 else length
    if kept == 0 and value > 0 and length > 0:
        least = smallest_fraction(int(length))
        raise ConfigurationError(
            f"Trainer({argument}={value}) keeps no batch of the {loader}: {value} * {int(length)} "
            f"batches < 1. Pass at least {argument}={least} (or an int count of batches; "
            f"{argument}=0 to skip it on purpose)."
        )
    return kept


def check_overfit_batches(value: int | float) -> int | float:
    """``overfit_batches``: an int count of batches or a float fraction in [0.0, 1.0] (0: off)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _fail("overfit_batches", value, "an int >= 0 or a float in [0.0, 1.0]; 0 is off")
    if isinstance(value, float) and value > 1.0:
        raise _fail("overfit_batches", value, "a float fraction in [0.0, 1.0], or an int count")
    return value


def check_accumulation(value: Any) -> int:
    """``accumulate_grad_batches``: an int >= 1; a whole float (2.0, read from YAML) is that int.

    Lightning takes any number, and 2.5 steps when the batch count is a multiple of 2.5 (every
    5th batch) and at the epoch's end: refused here, so no one relies on that.
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value) or value < 1:
        raise _fail(
            "accumulate_grad_batches",
            value,
            "an int >= 1 of batches per optimizer step (a whole float such as 2.0 is taken)",
        )
    return value


def check_min_limits(min_epochs: int | None, min_steps: int | None) -> tuple[int, int | None]:
    """``min_epochs`` / ``min_steps`` checked and resolved as Lightning resolves them.

    ``min_epochs`` defaults to 0, or to 1 when ``min_steps`` is set (so a stop requested in
    ``on_fit_start`` is re-examined after the first epoch); ``min_steps`` stays None when unset.
    A negative ``min_epochs`` (-1) asks for no minimum and is kept, as Lightning keeps it.
    """
    if min_epochs is not None and not _is_int(min_epochs):
        raise _fail("min_epochs", min_epochs, "an int (<= 0: no minimum) or None")
    if min_steps is not None and (not _is_int(min_steps) or min_steps < 0):
        raise _fail("min_steps", min_steps, "an int >= 0 or None")
    if min_epochs is None:
        min_epochs = 1 if min_steps is not None else 0
    return min_epochs, min_steps


def check_val_interval(
    value: int | float | str | dt.timedelta | dict[str, int] | None,
    check_val_every_n_epoch: int | None,
) -> int | float | dt.timedelta:
    """``val_check_interval``: a fraction of an epoch in [0.0, 1.0], an int of batches, or a
    duration (``"DD:HH:MM:SS"``, a timedelta or a dict of its fields: validate once that much
    time has passed; a timedelta comes back). None: 1.0, as in Lightning. 0.0 validates after
    every batch, as Lightning's (its interval is at least one batch).

    A fraction other than 1.0 needs epochs to count it in: with ``check_val_every_n_epoch=None``
    it is refused, as Lightning refuses it.
    """
    if value is None:
        return 1.0
    if is_duration(value):
        return parse_duration("Trainer(val_check_interval", value, allow_zero=False)
    is_number = not isinstance(value, bool) and isinstance(value, int | float)
    if not is_number or value < 0 or (_is_int(value) and value == 0):
        raise ConfigurationError(
            f"Trainer(val_check_interval={describe(value)}): expected a float in [0.0, 1.0] "
            "(fraction of an epoch), an int number of training batches (>= 1), or a duration "
            "('DD:HH:MM:SS', a timedelta or a dict)."
        )
    if isinstance(value, float) and value > 1.0:
        raise ConfigurationError(
            f"Trainer(val_check_interval={value}): a float must be in [0.0, 1.0]; for a count of "
            "batches pass an int."
        )
    if isinstance(value, float) and value != 1.0 and check_val_every_n_epoch is None:
        raise ConfigurationError(
            f"Trainer(val_check_interval={value}, check_val_every_n_epoch=None): a fraction of "
            "an epoch needs epochs to count in. Pass an int number of training batches, or "
            "set check_val_every_n_epoch."
        )
    return value


def check_sanity_steps(value: int | None) -> int:
    """``num_sanity_val_steps`` (None: 2, as in Lightning); -1 runs the whole validation set, and
    another negative none (Lightning's ``min(steps, batches)`` is then below one batch)."""
    if value is None:
        return 2
    if not _is_int(value):
        raise ConfigurationError(
            f"Trainer(num_sanity_val_steps={describe(value)}): expected an int >= 0, or -1 for "
            "the whole validation set."
        )
    return 0 if value < -1 else value
