"""``hparams.yaml``: the hyperparameters file of a versioned run folder, and atomic text files.

Lightning's CSVLogger and TensorBoardLogger both write one in their log folder; people read it
and ``load_from_checkpoint(hparams_file=...)`` takes it. `HparamsFile` keeps one logger's
file: later calls merge into the earlier values (a resumed run merges into the file the earlier
run wrote), values ``yaml.safe_dump`` cannot write are stored as their ``str()``, keys stay in
the order they were recorded, and every write replaces the file atomically (`atomic_open`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from trainer.errors import ConfigurationError
from trainer.loggers.params import to_yaml_safe

__all__ = ["HPARAMS_FILE", "HparamsFile", "atomic_open"]

HPARAMS_FILE = "hparams.yaml"


@contextlib.contextmanager
def atomic_open(path: str) -> Iterator[TextIO]:
    """Write to a sibling temporary file, then ``os.replace``: a crash leaves the old file whole."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


class HparamsFile:
    """The ``hparams.yaml`` of one logger's folder.

    Args:
        owner: the logger's name, for error messages (``"CSVLogger"``).
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._values: dict[str, Any] | None = None  # None: the file on disk not read yet

    def merge(self, log_dir: str, params: Mapping[str, Any]) -> None:
        """Merge ``params`` into ``<log_dir>/hparams.yaml`` and write it now.

        Raises:
            ConfigurationError: an existing ``hparams.yaml`` (a resumed run's) is not valid YAML.
        """
        values = self._read(log_dir)
        values.update(to_yaml_safe(dict(params)))
        self._write(log_dir, values)

    def write_if_missing(self, log_dir: str) -> None:
        """Write the values merged so far (``{}`` when none) when ``log_dir`` exists and has no
        ``hparams.yaml`` yet (Lightning's TensorBoardLogger at the end of a run)."""
        path = os.path.join(log_dir, HPARAMS_FILE)
        if os.path.isdir(log_dir) and not os.path.exists(path):
            self._write(log_dir, self._values or {})

    def _read(self, log_dir: str) -> dict[str, Any]:
        if self._values is None:
            self._values = _read_hparams(os.path.join(log_dir, HPARAMS_FILE), self._owner)
        return self._values

    def _write(self, log_dir: str, values: dict[str, Any]) -> None:
        import yaml  # lazily: importing `trainer` should not pay for PyYAML

        text = yaml.safe_dump(values, sort_keys=False, allow_unicode=True)
        os.makedirs(log_dir, exist_ok=True)
        with atomic_open(os.path.join(log_dir, HPARAMS_FILE)) as file:
            file.write(text)


def _read_hparams(path: str, owner: str) -> dict[str, Any]:
    """Hyperparameters an earlier run of this version wrote, so a resumed run merges into them."""
    import yaml

    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as file:
        try:
            loaded = yaml.safe_load(file)
        except yaml.YAMLError as err:
            raise ConfigurationError(
                f"{owner} could not read the existing {path} ({err}). Fix or delete the file, "
                f"or log to another version."
            ) from err
    return dict(loaded) if isinstance(loaded, Mapping) else {}
