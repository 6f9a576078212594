"""Profilers: time the Trainer's actions (and your own) with Lightning's names and semantics.

``Trainer(profiler="simple" | "advanced" | "pytorch" | Profiler())`` picks one;
`resolve_profiler` turns that value into a `Profiler`, and `PassThroughProfiler` is used when
none is chosen. Each class lives in its own module: the `Profiler` base in ``profiler.py``,
then ``simple.py`` (wall-clock table), ``advanced.py`` (cProfile), ``pytorch.py``
(``torch.profiler`` and Chrome traces) and ``passthrough.py``. Importing this package imports
neither ``pstats`` nor anything beyond torch; docs/profilers.md is the user guide.
"""

from __future__ import annotations

from trainer.profilers.advanced import AdvancedProfiler
from trainer.profilers.passthrough import PassThroughProfiler
from trainer.profilers.profiler import Profiler
from trainer.profilers.pytorch import PyTorchProfiler
from trainer.profilers.resolve import resolve_profiler
from trainer.profilers.simple import SimpleProfiler

__all__ = [
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "SimpleProfiler",
    "resolve_profiler",
]
