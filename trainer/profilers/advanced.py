"""`AdvancedProfiler`: Python's cProfile, one profile per action, reported with pstats.

This module owns the cProfile objects (one per action name) and their switching: only one
cProfile can be enabled at a time in a thread, so a nested action pauses the enclosing one and
resumes it when it stops. It does not choose the actions nor where the report goes (the
`Profiler` base class does).
"""

from __future__ import annotations

import cProfile
import io
import os

from trainer.errors import ConfigurationError
from trainer.profilers.profiler import Profiler

__all__ = ["AdvancedProfiler"]


class AdvancedProfiler(Profiler):
    """Record every Python function call made during each action, with cProfile.

    The report has one pstats listing per action, sorted by cumulative time. It is detailed and
    slow to record (cProfile sees every call), so use it to look inside an action that
    `SimpleProfiler` showed to be slow. While a nested action runs, the enclosing action is
    paused, so each listing holds the calls made under that action and not under a nested one.

    Args:
        dirpath: folder of the report file (and of the ``.prof`` dumps); ``None`` uses the
            Trainer's log directory.
        filename: when given, the report is appended to ``<dirpath>/<stage>-<filename>.txt``
            instead of being printed.
        line_count_restriction: how many functions each listing shows: an int is a count, a
            float in [0, 1] a fraction of the functions (1.0, the default, shows all).
        dump_stats: also write each action's raw profile to
            ``<dirpath>/<stage>-<filename>-<action>.prof`` (open it with ``pstats`` or snakeviz).

    Raises:
        ConfigurationError: ``line_count_restriction`` is negative or not a number; ``stop``
            of an action that is not running; ``dump_stats=True`` with no folder known.

    Example:
        >>> import json
        >>> profiler = AdvancedProfiler(line_count_restriction=5)
        >>> with profiler.profile("encode"):
        ...     text = json.dumps({"numbers": list(range(1000))})
        >>> "Profile stats for: encode" in profiler.summary()
        True
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        is_number = isinstance(line_count_restriction, int | float)
        if isinstance(line_count_restriction, bool) or not is_number or line_count_restriction < 0:
            raise ConfigurationError(
                f"AdvancedProfiler(line_count_restriction={line_count_restriction!r}) "
                f"(type {type(line_count_restriction).__name__}): expected a count (int >= 0) or "
                "a fraction of the lines (float in [0, 1]). Pass e.g. 20 or 0.1."
            )
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._profiles: dict[str, cProfile.Profile] = {}
        self._active: list[str] = []  # nested actions, innermost last; only the last is enabled

    def start(self, action_name: str) -> None:
        if self._active:
            self._profiles[self._active[-1]].disable()
        profile = self._profiles.get(action_name)
        if profile is None:
            profile = self._profiles[action_name] = cProfile.Profile()
        self._active.append(action_name)
        profile.enable()

    def stop(self, action_name: str) -> None:
        if action_name not in self._active:
            raise ConfigurationError(
                f"AdvancedProfiler.stop({action_name!r}): the action is not running. Call "
                f"start({action_name!r}) first, or use `with profiler.profile(...)`."
            )
        self._profiles[self._active[-1]].disable()
        index = len(self._active) - 1 - self._active[::-1].index(action_name)
        del self._active[index]
        if self._active:
            self._profiles[self._active[-1]].enable()

    def summary(self) -> str:
        """One pstats listing per action, sorted by cumulative time, under Lightning's header."""
        import pstats

        texts: dict[str, str] = {}
        for action_name, profile in self._profiles.items():
            if self.dump_stats:
                self._dump(action_name, profile)
            stream = io.StringIO()
            stats = pstats.Stats(profile, stream=stream).strip_dirs().sort_stats("cumulative")
            stats.print_stats(self.line_count_restriction)
            texts[action_name] = stream.getvalue()
        return self._stats_to_str(texts)

    def teardown(self, stage: str | None) -> None:
        """Stop every running action and forget the profiles (the next stage starts empty)."""
        if self._active:
            self._profiles[self._active[-1]].disable()
        self._active.clear()
        self._profiles.clear()

    def __getstate__(self) -> dict[str, object]:
        """Pickle without the cProfile objects, which cannot be pickled (as Lightning does)."""
        return {**self.__dict__, "_profiles": {}, "_active": []}

    def _dump(self, action_name: str, profile: cProfile.Profile) -> None:
        """Write one raw profile next to the report, for tools that read ``.prof`` files."""
        if not self.dirpath:
            raise ConfigurationError(
                "AdvancedProfiler(dump_stats=True) has no folder to write to: dirpath is None and "
                "no log_dir was given to setup(). Pass AdvancedProfiler(dirpath=...)."
            )
        os.makedirs(self.dirpath, exist_ok=True)
        name = self._file_name(action_name=action_name, extension=".prof")
        profile.dump_stats(os.path.join(os.fspath(self.dirpath), name))
