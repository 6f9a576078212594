"""A logger that keeps each run in ``<save_dir>/<name>/version_<N>``: the shared folder logic.

CSVLogger and TensorBoardLogger both number their runs this way; this class owns the naming
(``name``, ``version``, ``save_dir``, ``root_dir``), finding the next free version, and checking
a version restored from a checkpoint before it names a folder. ``save_dir`` is made absolute
when the logger is built, so a later ``os.chdir`` (a notebook, a sweep's trial folders) does not
move the run.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.checkpoint.paths import resolve_inside
from trainer.errors import CheckpointError, ConfigurationError, describe
from trainer.loggers.logger import Logger

__all__ = [
    "VERSION_PREFIX",
    "VersionedFolderLogger",
    "argument_error",
    "check_folder_arguments",
    "checked_restored_version",
]

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
        """The root folder of all experiments, made absolute when the logger was built."""
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: the folder holding this experiment's versions."""
        return os.path.join(self._save_dir, self._name) if self._name else self._save_dir

    def _version_folder(self, version: int | str) -> str:
        """``version_<N>`` for an int, the str itself otherwise."""
        return version if isinstance(version, str) else f"{VERSION_PREFIX}{version}"

    def _restore_version(self, state_dict: dict[str, Any], *, is_free: bool) -> None:
        """Take the checkpoint's version (checked first) when ``is_free`` (none was given or used)."""
        saved = state_dict.get("version")
        if saved is None:
            return
        version = checked_restored_version(type(self).__name__, self.root_dir, saved)
        if is_free:
            self._version = version

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


def argument_error(
    owner: str, argument: str, value: object, expected: str, fix: str
) -> ConfigurationError:
    """``<owner> expected <argument> to be <expected>, received <value>. <fix>``."""
    return ConfigurationError(
        f"{owner} expected {argument} to be {expected}, received {describe(value)}. {fix}"
    )


def check_folder_arguments(
    owner: str, save_dir: object, name: object, version: object, prefix: object
) -> None:
    """Reject bad ``save_dir`` / ``name`` / ``version`` / ``prefix`` before anything is written."""
    if not isinstance(save_dir, (str, os.PathLike)):
        raise argument_error(
            owner, "save_dir", save_dir, "a str or os.PathLike", "Pass a folder, e.g. 'logs'."
        )
    if name is not None and not isinstance(name, str):
        raise argument_error(owner, "name", name, "a str or None", "Pass e.g. name='mnist'.")
    is_bad_int = isinstance(version, bool) or (isinstance(version, int) and version < 0)
    if (version is not None and not isinstance(version, (int, str))) or is_bad_int:
        raise argument_error(
            owner, "version", version, "an int >= 0, a str or None", "Pass e.g. version=0."
        )
    if version == "":
        raise argument_error(
            owner, "version", version, "a non-empty str", "Pass None to pick the next version."
        )
    if not isinstance(prefix, str):
        raise argument_error(owner, "prefix", prefix, "a str", "Pass e.g. prefix='train'.")


def checked_restored_version(owner: str, root_dir: str, version: Any) -> int | str:
    """A version read from a checkpoint, refused unless its folder stays inside ``root_dir``.

    Raises:
        CheckpointError: naming the logger, the field ``version`` and the value received.
    """
    source = f"the checkpoint's {owner} state"
    if isinstance(version, int) and not isinstance(version, bool):
        if version < 0:
            raise CheckpointError(
                f"{source}, field 'version': expected an int >= 0 or a folder name, received "
                f"{describe(version)}. The checkpoint is corrupt or was not written by trainer; "
                "use another checkpoint, or pass the logger a version."
            )
        return version
    resolve_inside(root_dir, version, source=source, field="version")  # raises if it escapes
    return version
