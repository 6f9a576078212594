"""The `Profiler` base class: the contract between the Trainer and every profiler.

This module owns what all profilers share, with Lightning's names and semantics: the
``start`` / ``stop`` pair and the ``profile`` context manager around an action, the
``setup`` / ``describe`` / ``teardown`` life cycle of one stage, and where a report goes (printed
on global rank zero, or appended to ``<dirpath>/<stage>-<filename>[-<local_rank>].txt``). It does
not measure anything itself (the subclasses do) and it does not decide which parts of the loop
are timed (the Trainer does, under the action names listed in docs/profilers.md).
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any

from trainer.errors import ConfigurationError, describe

__all__ = ["Profiler"]

_UNSAFE_IN_FILE_NAMES = re.compile(r"[\\/:*?\"<>|\n\r\t]")
_REPEATED_UNDERSCORES = re.compile(r"_+")


class _ProfiledAction(AbstractContextManager[str]):
    """The object ``Profiler.profile`` returns: a slotted class is cheaper than ``@contextmanager``."""

    __slots__ = ("_action_name", "_profiler")

    def __init__(self, profiler: Profiler, action_name: str) -> None:
        self._profiler = profiler
        self._action_name = action_name

    def __enter__(self) -> str:
        self._profiler.start(self._action_name)
        return self._action_name

    def __exit__(self, *exc_info: Any) -> None:
        self._profiler.stop(self._action_name)


class Profiler(ABC):
    """Base class of every profiler; subclass it to write your own (define ``start`` and ``stop``).

    A profiler records named *actions*. The Trainer calls ``setup(stage, ...)`` when a stage
    (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``) begins, wraps the parts of its loop in
    ``profile(action_name)``, then calls ``describe()`` (print or write the report) and
    ``teardown(stage)`` when the stage ends. A profiler also works on its own, without a Trainer.

    Args:
        dirpath: folder for the report file (and traces). When ``None``, ``setup`` uses the
            ``log_dir`` it receives (the Trainer's log directory), as Lightning does.
        filename: when given, ``describe()`` appends the report to
            ``<dirpath>/<stage>-<filename>.txt`` (``-<local_rank>`` is added when the Trainer
            runs several processes) instead of printing it. ``.txt`` is added for you.

    Raises:
        ConfigurationError: ``dirpath`` is not a path, or ``filename`` is not a string.

    Example:
        >>> import time
        >>> class CountingProfiler(Profiler):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.calls = 0
        ...     def start(self, action_name: str) -> None:
        ...         self.calls += 1
        ...     def stop(self, action_name: str) -> None:
        ...         pass
        ...     def summary(self) -> str:
        ...         return f"{self.calls} actions"
        >>> profiler = CountingProfiler()
        >>> for _ in range(3):
        ...     with profiler.profile("load_batch"):
        ...         time.sleep(0.001)
        >>> profiler.summary()
        '3 actions'
    """

    def __init__(
        self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None
    ) -> None:
        if dirpath is not None and not isinstance(dirpath, str | os.PathLike):
            raise ConfigurationError(
                f"{type(self).__name__}(dirpath=...) received {describe(dirpath)}; expected a "
                "folder path (str or os.PathLike) or None. Pass e.g. dirpath='profiles'."
            )
        if filename is not None and not isinstance(filename, str):
            raise ConfigurationError(
                f"{type(self).__name__}(filename=...) received {describe(filename)}; expected a "
                "file name (str) or None. Pass e.g. filename='perf' to write fit-perf.txt."
            )
        self.dirpath: str | os.PathLike[str] | None = dirpath
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Begin recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """End recording ``action_name`` (started by ``start``)."""

    def summary(self) -> str:
        """The report of what was recorded since ``setup`` (empty when there is nothing to say)."""
        return ""

    def profile(self, action_name: str) -> AbstractContextManager[str]:
        """A context manager that records the block it wraps as ``action_name``.

        ``start`` runs on entry and ``stop`` on exit, also when the block raises. The ``as``
        target is the action name.

        Args:
            action_name: the row under which the block is reported, e.g. ``"my_action"``.

        Returns:
            A context manager.

        Example:
            >>> from trainer.profilers import SimpleProfiler
            >>> profiler = SimpleProfiler()
            >>> with profiler.profile("tokenize") as name:
            ...     words = "a b c".split()
            >>> name
            'tokenize'
        """
        return _ProfiledAction(self, action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Prepare for one stage; the Trainer calls this before the stage's first action.

        Args:
            stage: ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``; it names the report
                and the files.
            local_rank: this process's local rank when several processes run (it is added to
                file names), ``None`` for a single process (as Lightning's Trainer passes it).
            log_dir: the folder used when the profiler was built without ``dirpath``.
        """
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """End the stage: release what the profiler holds. Calling it twice is harmless."""

    def describe(self) -> None:
        """Report what was recorded, then tear the stage down.

        The report (``summary()``) is appended to ``<dirpath>/<stage>-<filename>.txt`` when
        ``filename`` was given and a folder is known (``dirpath``, or the ``log_dir`` passed to
        ``setup``); every process writes its own file. Otherwise it is printed, on global rank
        zero only. An empty summary prints and writes nothing.
        """
        report = self.summary()
        if report:
            path = self._report_path()
            if path is not None:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a", encoding="utf-8") as file:
                    file.write(report)
            elif self._is_global_zero():
                print(report)
        self.teardown(self._stage)

    @property
    def local_rank(self) -> int:
        """The local rank given to ``setup``, 0 when none was."""
        return 0 if self._local_rank is None else self._local_rank

    def _report_path(self) -> str | None:
        """Where ``describe`` writes; ``None`` means print (Lightning needs both names for a file)."""
        if not self.filename or not self.dirpath:
            return None
        return os.path.join(os.fspath(self.dirpath), self._file_name())

    def _file_name(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """Lightning's naming: ``<stage>-<filename>-<local_rank>-<action><extension>``, parts optional."""
        parts = [self._stage, self.filename, self._local_rank, action_name]
        base = "-".join(str(part) for part in parts if part is not None and part != "")
        base = _REPEATED_UNDERSCORES.sub("_", _UNSAFE_IN_FILE_NAMES.sub("_", base)).strip()
        return (base or "profile") + extension

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """One report from per-action texts, headed like Lightning's ("FIT Profiler Report")."""
        lines = [f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"]
        rank = "" if self._local_rank is None else f" rank: {self._local_rank}"
        for action_name, text in stats.items():
            lines.append(f"Profile stats for: {action_name}{rank}")
            lines.append(text)
        return "\n".join(lines)

    def _is_global_zero(self) -> bool:
        """Whether this process prints: rank 0 of the process group, else of the launcher's env."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank() == 0
        rank = os.environ.get("RANK", "")
        if rank.isdigit():
            return int(rank) == 0
        return self.local_rank == 0
