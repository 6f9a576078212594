"""`resolve_profiler`: turn the value of ``Trainer(profiler=...)`` into a `Profiler`.

This module owns the accepted names ("simple", "advanced", "pytorch", any case) and the error
for anything else. It does not build the Trainer's log directory (the Trainer passes it to
``Profiler.setup``) nor decide when profiling is off (``barebones=True`` is checked by the
Trainer).
"""

from __future__ import annotations

import difflib

from trainer.errors import ConfigurationError, describe
from trainer.profilers.advanced import AdvancedProfiler
from trainer.profilers.passthrough import PassThroughProfiler
from trainer.profilers.profiler import Profiler
from trainer.profilers.pytorch import PyTorchProfiler
from trainer.profilers.simple import SimpleProfiler

__all__ = ["resolve_profiler"]

_BY_NAME: dict[str, type[Profiler]] = {
    "simple": SimpleProfiler,
    "advanced": AdvancedProfiler,
    "pytorch": PyTorchProfiler,
}


def resolve_profiler(value: str | Profiler | None, *, dirpath: str | None = None) -> Profiler:
    """The profiler ``Trainer(profiler=value)`` uses.

    Args:
        value: ``None`` (no profiling: a `PassThroughProfiler`), ``"simple"``, ``"advanced"``
            or ``"pytorch"`` (any case; a new profiler of that class), or a `Profiler` instance,
            returned as is.
        dirpath: the ``dirpath`` of a profiler built from a name; ``None`` lets it use the
            log directory the Trainer gives to ``setup``.

    Returns:
        A `Profiler`.

    Raises:
        ConfigurationError: ``value`` is another string, a `Profiler` class instead of an
            instance, or any other object. The message lists the accepted values.

    Example:
        >>> type(resolve_profiler("Simple")).__name__
        'SimpleProfiler'
        >>> type(resolve_profiler(None)).__name__
        'PassThroughProfiler'
    """
    if value is None:
        return PassThroughProfiler()
    if isinstance(value, Profiler):
        return value
    if isinstance(value, str) and value.lower() in _BY_NAME:
        return _BY_NAME[value.lower()](dirpath=dirpath)
    raise ConfigurationError(_unknown_profiler_message(value))


def _unknown_profiler_message(value: object) -> str:
    """What was received, what is accepted, and the nearest fix (the class, or a close name)."""
    expected = (
        'expected None, "simple", "advanced" or "pytorch" (any case), or a '
        "trainer.profilers.Profiler instance"
    )
    if isinstance(value, type) and issubclass(value, Profiler):
        fix = f"Pass an instance: Trainer(profiler={value.__name__}())."
    elif isinstance(value, str) and value.lower() == "xla":
        fix = 'trainer has no XLA profiler (Lightning\'s "xla"); use Trainer(profiler="pytorch").'
    else:
        close = difflib.get_close_matches(str(value).lower(), list(_BY_NAME), n=1)
        hint = f'Did you mean "{close[0]}"? ' if isinstance(value, str) and close else ""
        fix = f'{hint}Use e.g. Trainer(profiler="simple") or Trainer(profiler=SimpleProfiler()).'
    return f"Trainer(profiler=...) received {describe(value)}; {expected}. {fix}"
