"""A logger that keeps each run in ``<save_dir>/<name>/version_<N>``: the shared folder logic.

CSVLogger and TensorBoardLogger both number their runs this way; this class owns the naming
(``name``, ``version``, ``save_dir``, ``root_dir``) and finding the next free version.
"""

from __future__ import annotations

import os

from trainer.loggers.logger import Logger

__all__ = ["VERSION_PREFIX", "VersionedFolderLogger"]

VERSION_PREFIX = "version_"


class VersionedFolderLogger(Logger):
    """Base for loggers writing under ``<save_dir>/<name>/version_<N>``.

    Subclasses set ``_save_dir``, ``_name`` and ``_version`` (None: the next free number).
    """

    _save_dir: str
    _name: str
    _version: int | str | None

    @property
    def name(self) -> str:
        """The experiment name (``""`` when there is no name folder)."""
        return self._name

    @property
    def version(self) -> int | str:
        """The run's version; when it was not given, the next free number, fixed at first use."""
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @property
    def save_dir(self) -> str:
        """The root folder of all experiments, as given."""
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: the folder holding this experiment's versions."""
        return os.path.join(self._save_dir, self._name) if self._name else self._save_dir

    def _next_version(self) -> int:
        """One past the highest ``version_<N>`` folder in ``root_dir``, so no run is overwritten."""
        try:
            entries = os.listdir(self.root_dir)
        except FileNotFoundError:
            return 0
        numbers_found = [
            int(entry[len(VERSION_PREFIX) :])
            for entry in entries
            if entry.startswith(VERSION_PREFIX)
            and entry[len(VERSION_PREFIX) :].isdigit()
            and os.path.isdir(os.path.join(self.root_dir, entry))
        ]
        return max(numbers_found, default=-1) + 1
