"""The CSV logger: ``metrics.csv`` and ``hparams.yaml`` in a versioned folder on the local disk.

This module owns the run folder layout (``<save_dir>/<name>/version_<N>``), picking the next
free version number, buffering metric rows, writing ``metrics.csv`` atomically (a temporary file
in the same folder, then ``os.replace``), merging hyperparameters into ``hparams.yaml``, and
resuming an existing version without duplicated steps: `CSVLogger.state_dict` (called when a
checkpoint is saved) writes the buffered rows first and records how many rows the file then
has, so a run killed after a checkpoint has every row up to it on disk, and the resumed run
keeps exactly those rows and replaces the ones logged after it (or warns, naming the steps,
when rows the checkpoint counted are missing from the file). Counting rows rather than comparing
steps matters because steps are not monotonic: validation/test step rows are numbered by
batch, as Lightning numbers them. It does not decide when metrics are logged or what they are
called (the Trainer and callbacks do), nor which rank writes (the Trainer calls loggers on
global rank zero only).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from trainer.errors import CheckpointError, ConfigurationError, describe
from trainer.loggers._versioned import (
    VersionedFolderLogger,
    argument_error,
    check_folder_arguments,
)
from trainer.loggers.hparams_file import HparamsFile, atomic_open
from trainer.loggers.logger import (
    metric_as_float,
    resolve_step,
    split_tracker_values,
    warn_dropped,
)
from trainer.loggers.params import flatten_params

__all__ = ["CSVLogger"]

_METRICS_FILE = "metrics.csv"
_STEP_KEY = "step"


class CSVLogger(VersionedFolderLogger):
    """Log metrics to ``metrics.csv`` and hyperparameters to ``hparams.yaml``.

    Files go to ``<save_dir>/<name>/version_<N>/`` (no ``<name>`` folder when ``name`` is None
    or ``""``). The folder is created at the first write, not here. ``metrics.csv`` has a
    ``step`` column and one column per metric, sorted by name (as Lightning's); a metric that
    appears later widens the header and earlier rows get an empty cell.

    Rows are kept in memory and written by `log_metrics` once a step is
    ``flush_logs_every_n_steps`` past the last write, by `save` / `finalize`, and by
    `state_dict` (each checkpoint): a process killed with ``kill -9`` loses only the rows
    logged since the last of those, never a row its last checkpoint covers. Passing the
    ``version`` of an earlier run resumes it: its rows are kept, except those at or after the
    first step logged now; resuming from a checkpoint, exactly the rows the file had when the
    checkpoint was saved are kept, so a resumed run has no duplicated or missing rows.

    Args:
        save_dir: root folder of all experiments.
        name: experiment name, a sub-folder of ``save_dir``; None or ``""`` for none.
        version: an int gives ``version_<int>``, a str is used verbatim as the folder name,
            None picks the next free ``version_<N>`` under ``<save_dir>/<name>``.
        prefix: put before every metric name, joined with ``"-"`` (``"train"`` ->
            ``"train-loss"``).
        flush_logs_every_n_steps: write ``metrics.csv`` when a logged step is at least this many
            steps past the last write (and always in ``save`` / ``finalize``).

    Raises:
        ConfigurationError: an argument has the wrong type or value.

    Examples:
        >>> logger = CSVLogger("logs", name="mnist")  # doctest: +SKIP
        >>> logger.log_hyperparams({"lr": 0.1, "batch_size": 32})  # doctest: +SKIP
        >>> logger.log_metrics({"loss": 0.25}, step=0)  # doctest: +SKIP
        >>> logger.log_metrics({"loss": 0.125, "acc": 0.75}, step=1)  # doctest: +SKIP
        >>> logger.finalize("success")  # doctest: +SKIP
        >>> open(logger.log_dir + "/metrics.csv").read()  # doctest: +SKIP
        'acc,loss,step\\r\\n,0.25,0\\r\\n0.75,0.125,1\\r\\n'
    """

    tracker_name = "csv"
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = "trainer_logs",
        name: str | None = "trainer_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        _check_arguments(save_dir, name, version, prefix, flush_logs_every_n_steps)
        # Absolute now: a later os.chdir must not move the run (see _versioned.py).
        self._save_dir = os.path.abspath(os.fspath(save_dir))
        self._name = name or ""
        self._version: int | str | None = version
        self._is_version_given = version is not None
        self._prefix = prefix
        self._flush_every = flush_logs_every_n_steps
        self._pending: list[dict[str, float | int | str]] = []
        self._columns: list[str] = [_STEP_KEY]
        # Header of the metrics.csv this logger last wrote; None until its first write.
        self._disk_columns: list[str] | None = None
        self._flushed_step = -1  # last step written to metrics.csv
        self._last_step: int | None = None
        self._rows_on_disk: int | None = None  # data rows in metrics.csv after our last write
        self._hparams_file = HparamsFile("CSVLogger")
        # The last step logged, and the rows metrics.csv had, when the checkpoint being resumed
        # was saved (load_state_dict; no row count in checkpoints of earlier versions).
        self._checkpoint_step: int | None = None
        self._checkpoint_rows: int | None = None

    @property
    def log_dir(self) -> str:
        """``<root_dir>/version_<N>`` (or ``<root_dir>/<version>`` for a str version)."""
        return os.path.join(self.root_dir, self._version_folder(self.version))

    @property
    def experiment(self) -> CSVLogger:
        """The logger itself: it is its own writer (``logger.experiment.log_metrics`` works)."""
        return self

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Buffer one row of ``metrics`` at ``step``; write the file every N calls.

        Args:
            metrics: metric name -> number; 0-dim tensors are read with ``float()``.
            step: the global step; None means one past the last step logged (0 at first).

        Raises:
            ConfigurationError: a value is not a number, a metric is named ``"step"``, or
                ``step`` is not an int.

        Examples:
            >>> logger.log_metrics({"loss": torch.tensor(0.5)}, step=3)  # doctest: +SKIP
            >>> logger.save()  # doctest: +SKIP   # metrics.csv now has the row "3,0.5"
        """
        step = resolve_step("CSVLogger", step, self._last_step)
        row: dict[str, float | int | str] = {_STEP_KEY: step}
        for key, value in metrics.items():
            column = f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key
            if column == _STEP_KEY:
                raise ConfigurationError(
                    f"CSVLogger.log_metrics received a metric named {_STEP_KEY!r}, which is the "
                    f"name of metrics.csv's step column (step {step}). Rename the metric, "
                    f"e.g. 'train_step', or pass it as the step argument."
                )
            row[column] = metric_as_float("CSVLogger.log_metrics", key, value)
        self._append_row(row, step)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Accelerate's ``tracker.log`` (Accelerate has no CSV tracker): one row at ``step``
        (None: one past the last step) with what a CSV cell holds. Numbers and one-element
        tensors are written as `log_metrics` writes them; a str as a text cell; a dict is
        flattened to one column per member, ``{"group": {"a": 1.0}}`` -> ``group/a`` (the keys
        W&B shows); any other value (None, a list, a larger tensor) is dropped with a warning
        naming its key. ``kwargs`` are not used.

        Raises:
            ConfigurationError: a column would be named ``"step"``, or ``step`` is not an int.
        """
        step = resolve_step("CSVLogger", step, self._last_step)
        numbers, others = split_tracker_values(flatten_params(values))
        cells: dict[str, Any] = {
            key: metric_as_float("CSVLogger.log", key, value) for key, value in numbers.items()
        }
        for key, value in others.items():
            if isinstance(value, str):
                cells[key] = value
            else:
                warn_dropped("CSVLogger", key, value, keeps="numbers and text")
        row: dict[str, float | int | str] = {_STEP_KEY: step}
        for key, cell in cells.items():
            column = f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key
            if column == _STEP_KEY:
                raise ConfigurationError(
                    f"CSVLogger.log received a value named {_STEP_KEY!r}, which is the name of "
                    f"metrics.csv's step column (step {step}). Rename it, e.g. 'train_step', "
                    "or pass it as the step argument."
                )
            row[column] = cell
        self._append_row(row, step)

    def _append_row(self, row: dict[str, float | int | str], step: int) -> None:
        """Buffer a checked ``row`` logged at ``step``; write the file when it is due."""
        # Columns grow only once the whole row is valid, so a rejected row leaves no trace.
        if row.keys() - set(self._columns):
            self._columns = sorted({*self._columns, *row})
        self._pending.append(row)
        self._last_step = step
        if step - self._flushed_step >= self._flush_every:
            self.save()

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Merge ``params`` into ``hparams.yaml`` and write it now.

        Values ``yaml.safe_dump`` cannot write (paths, classes, tensors, ...) are stored as their
        ``str()``; tuples and sets become lists. A resumed run keeps the earlier file's keys.

        Args:
            params: a mapping or an ``argparse.Namespace``.

        Raises:
            ConfigurationError: ``params`` is neither, or the existing ``hparams.yaml`` of a
                resumed run is not valid YAML.

        Examples:
            >>> logger.log_hyperparams({"lr": 0.1, "layers": (64, 64)})  # doctest: +SKIP
            >>> # hparams.yaml: "lr: 0.1\\nlayers:\\n- 64\\n- 64\\n"
        """
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        if not isinstance(params, Mapping):
            raise ConfigurationError(
                f"CSVLogger.log_hyperparams expected a dict or an argparse.Namespace, received "
                f"{describe(params)}. Pass e.g. {{'lr': 0.1}}."
            )
        self._hparams_file.merge(self._ensure_log_dir(), params)

    def save(self) -> None:
        """Write the buffered rows to ``metrics.csv`` (atomically); a no-op when none are."""
        if self._last_step is not None:
            self._flushed_step = self._last_step
        if not self._pending:
            return
        path = os.path.join(self._ensure_log_dir(), _METRICS_FILE)
        if self._disk_columns == self._columns and os.path.isfile(path):
            # Same header as on disk: append the new rows in one write (no copy, no fsync here;
            # finalize fsyncs). Only a widened header rewrites the file, atomically.
            buffer = io.StringIO()
            _write_rows(buffer, self._columns, self._pending, header=False)
            with open(path, "a", newline="", encoding="utf-8") as file:
                file.write(buffer.getvalue())
            self._rows_on_disk = (self._rows_on_disk or 0) + len(self._pending)
        else:
            old_columns, old_rows = _read_metrics(path)
            if self._disk_columns is None:
                old_rows = self._rows_to_keep(old_rows)
                self._columns = _merge_columns(old_columns, self._columns)
            with atomic_open(path) as file:
                _write_rows(file, self._columns, [*old_rows, *self._pending], header=True)
            self._rows_on_disk = len(old_rows) + len(self._pending)
        self._disk_columns = list(self._columns)
        self._pending.clear()

    def state_dict(self) -> dict[str, Any]:
        """Write the buffered rows, then return the run's identity, last logged ``step`` and
        the number of ``rows`` in ``metrics.csv``.

        Called when a checkpoint is saved, before it is written: every row the checkpoint
        covers is in ``metrics.csv`` by the time the checkpoint exists.
        """
        self.save()
        if self._rows_on_disk is None:  # nothing written since a resume: still the checkpoint's
            step, rows = self._checkpoint_step, self._checkpoint_rows
        else:
            step, rows = self._last_step, self._rows_on_disk
        return {"name": self.name, "version": self.version, "step": step, "rows": rows}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the saved run's ``version_N`` folder, unless a version was given.

        Raises:
            CheckpointError: the saved version would put the folder outside ``<save_dir>/<name>``
                (e.g. ``"../../x"``), or the saved step or row count is not an int.
        """
        self._restore_version(state_dict, is_free=not self._is_version_given and not self._pending)
        self._checkpoint_step = _checked_step(state_dict.get("step"))
        self._checkpoint_rows = _checked_step(state_dict.get("rows"), field="rows")

    def _rows_to_keep(self, rows: list[dict[str, str]]) -> list[dict[str, str]]:
        """The stored rows a resumed run keeps: after a checkpoint, the rows the file had when it
        was saved, and later rows at the checkpoint's own step (the epoch-end rows that follow a
        checkpoint saved at the end of validation: computed before it, not logged again); later
        rows are logged again. Without a checkpoint (or from one without a row count), the rows
        before the first step logged now and up to the checkpoint's step."""
        count = self._checkpoint_rows
        if count is not None:
            if len(rows) < count:
                warnings.warn(
                    f"CSVLogger: {os.path.join(self.log_dir, _METRICS_FILE)} has {len(rows)} "
                    f"rows, but the checkpoint being resumed was saved when it had {count} (up "
                    f"to step {self._checkpoint_step}): the last {count - len(rows)} rows were "
                    "lost and are not logged again.",
                    stacklevel=4,
                )
            at_checkpoint = [row for row in rows[count:] if _step_of(row) == self._checkpoint_step]
            return [*rows[:count], *at_checkpoint]
        first_step = int(self._pending[0][_STEP_KEY])
        if self._checkpoint_step is not None:
            first_step = min(first_step, self._checkpoint_step + 1)
        kept = [row for row in rows if not _is_at_or_after(row, first_step)]
        if self._checkpoint_step is not None:
            _warn_if_rows_lost(kept, self._checkpoint_step, self.log_dir)
        return kept

    def finalize(self, status: str) -> None:
        """Write what is buffered and make it durable; ``status`` is not recorded."""
        self.save()
        path = os.path.join(self.log_dir, _METRICS_FILE)
        if os.path.isfile(path):
            with open(path, "rb+") as file:
                os.fsync(file.fileno())

    def _ensure_log_dir(self) -> str:
        """Create the run folder at the first write (not in ``__init__``: loggers may never write)."""
        log_dir = self.log_dir
        os.makedirs(log_dir, exist_ok=True)
        return log_dir


def _checked_step(step: object, field: str = "step") -> int | None:
    """The ``step`` (or ``rows``) of a checkpoint's logger state: None (older checkpoints) or an
    int (>= 0 for ``rows``)."""
    if step is None or (
        isinstance(step, int) and not isinstance(step, bool) and (field == "step" or step >= 0)
    ):
        return step
    expected = "an int" if field == "step" else "an int >= 0"
    raise CheckpointError(
        f"the checkpoint's CSVLogger state, field {field!r}: expected {expected} or None, "
        f"received {describe(step)}. The checkpoint is corrupt or was not written by trainer; "
        "use another."
    )


def _warn_if_rows_lost(kept: list[dict[str, str]], checkpoint_step: int, log_dir: str) -> None:
    """Say which steps the checkpoint counted but metrics.csv lacks (buffered when it stopped)."""
    steps = [int(float(row[_STEP_KEY])) for row in kept if (row.get(_STEP_KEY) or "").isdigit()]
    if steps and max(steps) >= checkpoint_step:
        return
    ends = f"ends at step {max(steps)}" if steps else "has no rows"
    first_lost = max(steps) + 1 if steps else 0
    warnings.warn(
        f"CSVLogger: {os.path.join(log_dir, _METRICS_FILE)} {ends}, but the checkpoint being "
        f"resumed was saved after step {checkpoint_step} was logged: the rows logged for "
        f"steps {first_lost} to {checkpoint_step} were lost (still in "
        "memory when the process stopped) and are not logged again. Checkpoints written by "
        "this version flush the rows first.",
        stacklevel=4,
    )


def _check_arguments(
    save_dir: object, name: object, version: object, prefix: object, flush_every: object
) -> None:
    """Reject bad constructor arguments before anything is resolved or written."""

    check_folder_arguments("CSVLogger", save_dir, name, version, prefix)
    if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
        raise argument_error(
            "CSVLogger",
            "flush_logs_every_n_steps",
            flush_every,
            "an int >= 1",
            "Pass the number of log_metrics calls between writes, e.g. 100.",
        )


def _write_rows(
    file: TextIO, columns: list[str], rows: Iterable[Mapping[str, Any]], *, header: bool
) -> None:
    """Write ``rows`` under ``columns``; a missing key is an empty cell."""
    writer = csv.DictWriter(file, fieldnames=columns, restval="", extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows(rows)


def _read_metrics(path: str) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of an existing ``metrics.csv`` (empty when there is none)."""
    if not os.path.isfile(path):
        return [], []
    with open(path, newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _merge_columns(old: list[str], new: list[str]) -> list[str]:
    """The file's columns and this run's, sorted by name as Lightning's CSVLogger writes them."""
    return sorted({*old, *new})


def _step_of(row: Mapping[str, str]) -> int | None:
    """A stored row's step; None when it is not readable."""
    try:
        return int(float(row.get(_STEP_KEY) or ""))
    except ValueError:
        return None


def _is_at_or_after(row: Mapping[str, str], step: int) -> bool:
    """Whether a stored row's step is >= ``step``; a row without a readable step is kept."""
    text = row.get(_STEP_KEY) or ""
    try:
        return float(text) >= step
    except ValueError:
        return False
