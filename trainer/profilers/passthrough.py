"""`PassThroughProfiler`: the profiler in use when none is chosen; it records nothing.

This module owns only the no-op: every method returns at once and ``describe`` prints nothing.
The Trainer can test for this class to skip wrapping its loop at all.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from trainer.profilers.profiler import Profiler

__all__ = ["PassThroughProfiler"]


class PassThroughProfiler(Profiler):
    """A profiler that does nothing: ``Trainer(profiler=None)`` uses it.

    Args:
        dirpath: accepted for symmetry with the other profilers; unused.
        filename: accepted for symmetry with the other profilers; unused.

    Example:
        >>> profiler = PassThroughProfiler()
        >>> with profiler.profile("training_step"):
        ...     total = sum(range(10))
        >>> profiler.summary()
        ''
    """

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def profile(self, action_name: str) -> AbstractContextManager[str]:
        return nullcontext(action_name)

    def describe(self) -> None:
        pass
