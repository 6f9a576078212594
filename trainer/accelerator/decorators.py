"""The machinery of Accelerate's ``@accelerator.on_*_process`` decorators.

`run_only_where` wraps a function so that each call asks, then, whether this process is the
one: the decorated function runs there and returns ``None`` elsewhere. `checked_index` checks a
``process_index`` / ``local_process_index`` argument. The decorators themselves (which process)
are the Accelerator's methods in ``trainer.accelerator.process_api``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.errors import ConfigurationError, describe

__all__ = ["checked_index", "run_only_where"]

_R = TypeVar("_R")


def run_only_where(
    function: Callable[..., _R] | None, is_here: Callable[[], bool], decorator: str
) -> Callable[..., _R | None]:
    """``function`` run only where ``is_here()`` is true at the call; elsewhere None.

    Raises:
        ConfigurationError: ``function`` is not callable (e.g. ``@accelerator.on_main_process()``
            with parentheses).
    """
    if not callable(function):
        raise ConfigurationError(
            f"accelerator.{decorator}: expected the function to decorate, received "
            f"{describe(function)}. Write @accelerator.{decorator} above the function (no "
            f"parentheses), or call accelerator.{decorator}(function)."
        )

    @functools.wraps(function)
    def run_here(*args: Any, **kwargs: Any) -> _R | None:
        return function(*args, **kwargs) if is_here() else None

    return run_here


def checked_index(decorator: str, argument: str, value: Any) -> int:
    """``value`` as a process index, or a ConfigurationError naming the decorator's argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(
            f"accelerator.{decorator}({argument}={describe(value)}): expected an int >= 0. "
            f"Write @accelerator.{decorator}({argument}=1)."
        )
    return value
