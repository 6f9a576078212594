"""The TensorBoard logger: event files with scalars, hyperparameters and the model graph, and
``hparams.yaml`` beside them (as Lightning's).

This module owns the run folder layout (``<save_dir>/<name>/version_<N>[/<sub_dir>]``, the same
numbering as CSVLogger), the ``torch.utils.tensorboard.SummaryWriter`` (created at the first
write, so ``import trainer`` never imports tensorboard), the hparams-plugin records, and resuming
a version without duplicated steps. It does not decide when metrics are logged or what they are
called (the Trainer does), nor which rank writes (the Trainer calls loggers on global rank zero
only).

Resuming: `TensorBoardLogger.state_dict` (called when a checkpoint is saved) flushes the event
file, so every point up to a checkpoint is on disk when the checkpoint is. After
`TensorBoardLogger.load_state_dict` (a fit resumed from a checkpoint), the first point logged is
preceded by a ``SessionLog.START`` event at the step after the checkpoint's (at the first step
logged, when the checkpoint recorded none). TensorBoard then drops every older event of that
folder at or after that step: the points the interrupted run logged after its checkpoint
disappear instead of showing twice. (Not at the first step logged: validation/test step points
are numbered by batch, as Lightning numbers them, so the first point may have a small step.)
``save_dir`` is made absolute when the logger is built (a later ``os.chdir`` does not move the
run), and a version read from a checkpoint must name a folder inside ``<save_dir>/<name>``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

from trainer._imports import is_available, require
from trainer.errors import CheckpointError, describe
from trainer.loggers._versioned import (
    VersionedFolderLogger,
    argument_error,
    check_folder_arguments,
)
from trainer.loggers.hparams_file import HparamsFile
from trainer.loggers.logger import (
    metric_as_float,
    resolve_step,
    split_tracker_values,
    warn_dropped,
)
from trainer.loggers.params import as_dict, flatten_params

__all__ = ["TensorBoardLogger"]

_HP_METRIC = "hp_metric"


class TensorBoardLogger(VersionedFolderLogger):
    """Log scalars, hyperparameters and optionally the model graph to TensorBoard event files.

    Files go to ``<save_dir>/<name>/version_<N>/`` (plus ``<sub_dir>`` when given; no
    ``<name>`` folder when ``name`` is None or ``""``); view them with
    ``tensorboard --logdir <save_dir>``. Each metric is one scalar point at the given step.
    `log_hyperparams` writes the hparams-plugin records (the HPARAMS tab) and, with
    ``default_hp_metric``, a placeholder scalar ``hp_metric = -1`` at step 0 that the plugin
    shows next to the hyperparameters. Scalars are stored as float32 (TensorBoard's format).

    Args:
        save_dir: root folder of all experiments.
        name: experiment name, a sub-folder of ``save_dir``; None or ``""`` for none.
        version: an int gives ``version_<int>``, a str is used verbatim as the folder name,
            None picks the next free ``version_<N>`` (fixed at first use).
        log_graph: whether `log_graph` writes the model graph (off by default: tracing
            the model costs time and memory).
        default_hp_metric: log ``hp_metric = -1`` at step 0 with the hyperparameters when no
            metrics are given to `log_hyperparams`.
        prefix: put before every metric name, joined with ``"-"`` (``"train"`` ->
            ``"train-loss"``).
        sub_dir: a folder inside the version folder for the event files (e.g. ``"fold_1"``).
        **writer_kwargs: passed to ``SummaryWriter`` (``max_queue``, ``flush_secs``,
            ``filename_suffix``).

    Raises:
        ConfigurationError: an argument has the wrong type or value.
        MissingDependencyError: tensorboard is not installed
            (``pip install 'trainer[tensorboard]'``).

    Examples:
        >>> logger = TensorBoardLogger("logs", name="mnist")  # doctest: +SKIP
        >>> logger.log_hyperparams({"lr": 0.1, "batch_size": 32})  # doctest: +SKIP
        >>> logger.log_metrics({"loss": 0.25}, step=10)  # doctest: +SKIP
        >>> logger.finalize("success")  # doctest: +SKIP
        >>> logger.log_dir  # doctest: +SKIP
        'logs/mnist/version_0'
    """

    tracker_name = "tensorboard"
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str | None = "trainer_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: str | os.PathLike[str] | None = None,
        **writer_kwargs: Any,
    ) -> None:
        _check_arguments(save_dir, name, version, prefix, sub_dir)
        _check_installed()
        # Absolute now: a later os.chdir must not move the run (see _versioned.py).
        self._save_dir = os.path.abspath(os.fspath(save_dir))
        self._name = name or ""
        self._version: int | str | None = version
        self._is_version_given = version is not None
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
        self._prefix = prefix
        self._sub_dir = os.fspath(sub_dir) if sub_dir is not None else None
        self._writer_kwargs = writer_kwargs
        self._experiment: Any = None
        self._last_step: int | None = None
        self._hparams: dict[str, Any] = {}  # flat, for the hparams plugin
        self._hparams_file = HparamsFile("TensorBoardLogger")  # nested, as logged
        self._metric_names: list[str] = []
        # Set by load_state_dict: the next log_metrics step starts a session that supersedes
        # the older events from that step on; hyperparameters wait until then (see module doc).
        self._is_resuming = False
        self._has_pending_hparams = False
        self._checkpoint_step: int | None = None  # last step logged when it was saved

    # ---- where ---------------------------------------------------------------------------------
    @property
    def log_dir(self) -> str:
        """``<root_dir>/version_<N>[/<sub_dir>]``: where the event files go."""
        log_dir = os.path.join(self.root_dir, self._version_folder(self.version))
        return os.path.join(log_dir, self._sub_dir) if self._sub_dir else log_dir

    @property
    def sub_dir(self) -> str | None:
        """The folder inside the version folder, if any."""
        return self._sub_dir

    @property
    def experiment(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter``, created (with its folder) at first use."""
        if self._experiment is None:
            require("tensorboard", extra="tensorboard", feature="TensorBoardLogger")
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            if self._is_resuming:
                _wait_for_a_later_file_name(self.log_dir)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._writer_kwargs)
        return self._experiment

    # ---- what ----------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Write one scalar point per metric at ``step``.

        Args:
            metrics: metric name -> number; 0-dim tensors are read with ``float()``.
            step: the global step; None means one past the last step logged (0 at first).

        Raises:
            ConfigurationError: a value is not a number, or ``step`` is not an int.

        Examples:
            >>> logger.log_metrics({"train/loss": 0.5, "epoch": 0.0}, step=50)  # doctest: +SKIP
        """
        self._log_scalars(metrics, step)

    def _log_scalars(self, metrics: Mapping[str, Any], step: int | None, **kwargs: Any) -> None:
        step = resolve_step("TensorBoardLogger", step, self._last_step)
        values = {
            self._tag(key): metric_as_float("TensorBoardLogger", key, value)
            for key, value in metrics.items()
        }
        if self._is_resuming:
            checkpoint_step = self._checkpoint_step
            self._start_session(step if checkpoint_step is None else checkpoint_step + 1)
        self._write_scalars(values, step, **kwargs)
        self._last_step = step

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Accelerate's ``tracker.log``, as its TensorBoard tracker writes: numbers (and
        one-element tensors) as scalars, a str with ``add_text`` (tag ``<key>/text_summary``), a
        dict of numbers with ``add_scalars`` (one sub-run folder ``<key>_<name>`` each); any
        other value (None, a list, a larger tensor), and a dict member that is not a number, is
        dropped with a warning naming it (Accelerate skips the first silently and raises on
        the second, on the main process only). All at ``step`` (None: one past the last step).
        ``kwargs`` (e.g. ``walltime``) go to each ``add_*`` call, as Accelerate's.
        """
        metrics, others = split_tracker_values(values)
        step = resolve_step("TensorBoardLogger", step, self._last_step)
        self._log_scalars(metrics, step, **kwargs)
        for key, value in others.items():
            if isinstance(value, str):
                self.experiment.add_text(self._tag(key), value, global_step=step, **kwargs)
            elif isinstance(value, Mapping):
                numbers, dropped = split_tracker_values({str(k): v for k, v in value.items()})
                for name, member in dropped.items():
                    warn_dropped("TensorBoardLogger", f"{key}/{name}", member)
                if numbers:
                    scalars = {name: float(number) for name, number in numbers.items()}
                    self.experiment.add_scalars(self._tag(key), scalars, global_step=step, **kwargs)
            else:
                warn_dropped("TensorBoardLogger", key, value)

    def log_hyperparams(
        self,
        params: Mapping[str, Any] | argparse.Namespace,
        metrics: Mapping[str, Any] | float | None = None,
    ) -> None:
        """Record ``params`` for the HPARAMS tab, with ``metrics`` as its metric columns.

        Nested dicts are flattened with ``"/"`` (``{"opt": {"lr": 0.1}}`` -> ``opt/lr``); values
        other than bool, int, float and str are stored as their ``str()``. Later calls merge
        into the earlier parameters. ``hparams.yaml`` in `log_dir` gets them as given (nested),
        as Lightning's TensorBoardLogger writes it (see `trainer.loggers.hparams_file`).

        Args:
            params: a mapping or an ``argparse.Namespace``.
            metrics: metric name -> value, logged at step 0 and shown as the plugin's metric
                columns; a bare number means ``{"hp_metric": number}``; None logs
                ``hp_metric = -1`` when ``default_hp_metric`` (not again on a resumed run).

        Raises:
            ConfigurationError: ``params`` is neither a mapping nor a Namespace, or a metric is
                not a number.

        Examples:
            >>> logger.log_hyperparams({"lr": 0.1}, metrics={"val/loss": 0.0})  # doctest: +SKIP
        """
        params = as_dict(params, "TensorBoardLogger.log_hyperparams")
        self._hparams.update(_hparams_values(flatten_params(params)))
        self._hparams_file.merge(self.log_dir, params)
        if metrics is None:
            is_placeholder_due = self._default_hp_metric and not self._is_resuming
            metrics = {_HP_METRIC: -1.0} if is_placeholder_due else {}
        elif not isinstance(metrics, Mapping):
            metrics = {_HP_METRIC: metrics}
        values = {
            self._tag(key): metric_as_float("TensorBoardLogger", key, value)
            for key, value in metrics.items()
        }
        self._metric_names.extend(name for name in values if name not in self._metric_names)
        self._write_scalars(values, 0)
        self._has_pending_hparams = True
        if not self._is_resuming:
            self._write_hparams()

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Trace ``model`` on ``input_array`` and write its graph (only with ``log_graph=True``).

        Args:
            model: a ``torch.nn.Module``.
            input_array: an example input; None uses ``model.example_input_array``. Tensors are
                moved to the model's device first.

        Warns:
            UserWarning: there is no example input, so no graph is written.
        """
        if not self._log_graph:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            warnings.warn(
                "TensorBoardLogger(log_graph=True) wrote no graph: there is no example input. "
                "Set `model.example_input_array` or call log_graph(model, input_array).",
                stacklevel=2,
            )
            return
        parameter = next(iter(model.parameters()), None)
        if parameter is not None and hasattr(input_array, "to"):
            input_array = input_array.to(parameter.device)
        self.experiment.add_graph(model, input_array)

    def save(self) -> None:
        """Flush the event files (the writer also flushes every ``flush_secs``, 120 by default)."""
        if self._has_pending_hparams:  # resumed, nothing logged since: nothing to supersede
            self._write_hparams()
        if self._experiment is not None:
            self._experiment.flush()

    def finalize(self, status: str) -> None:
        """Flush and close the event file; a later write opens a new file in the same folder.

        After a successful run whose folder exists, ``hparams.yaml`` exists too (``{}`` when no
        hyperparameters were logged), as Lightning's TensorBoardLogger leaves it.
        """
        self.save()
        if status == "success":
            self._hparams_file.write_if_missing(self.log_dir)
        if self._experiment is not None:
            self._experiment.close()
            self._experiment = None

    # ---- resuming ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Flush the event file, then return the run's identity and last logged ``step``.

        Called when a checkpoint is saved, before it is written: every point the checkpoint
        covers is on disk by the time the checkpoint exists.
        """
        if self._experiment is not None:
            self._experiment.flush()
        return {"name": self.name, "version": self.version, "step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the saved run's version folder (unless a version was given) without duplicates.

        The step after the checkpoint's (the first step logged afterwards, when the checkpoint
        recorded none) supersedes the folder's older events at or after it.

        Raises:
            CheckpointError: the saved version would put the folder outside ``<save_dir>/<name>``,
                or the saved step is not an int.
        """
        is_free = not self._is_version_given and self._experiment is None
        self._restore_version(state_dict, is_free=is_free)
        step = state_dict.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise CheckpointError(
                f"the checkpoint's TensorBoardLogger state, field 'step': expected an int or "
                f"None, received {describe(step)}. The checkpoint is corrupt or was not written "
                "by trainer; use another."
            )
        self._checkpoint_step = step
        self._is_resuming = True

    def _start_session(self, step: int) -> None:
        """Write ``SessionLog.START`` at ``step`` (TensorBoard drops older events from ``step`` on),
        then the hyperparameters that waited for it, so they are not dropped with them."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._is_resuming = False
        event = Event(wall_time=time.time(), step=step)
        event.session_log.status = SessionLog.START
        # SummaryWriter has no public way to write a raw event or summary.
        self.experiment._get_file_writer().add_event(event)  # noqa: SLF001
        if self._has_pending_hparams:
            self._write_hparams()

    # ---- helpers -------------------------------------------------------------------------------
    def _tag(self, key: str) -> str:
        return f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key

    def _write_scalars(self, values: Mapping[str, float], step: int, **kwargs: Any) -> None:
        writer = self.experiment
        for tag, value in values.items():
            writer.add_scalar(tag, value, global_step=step, **kwargs)

    def _write_hparams(self) -> None:
        """The three hparams-plugin summaries, in the run's own event file (not a sub-run)."""
        from torch.utils.tensorboard.summary import hparams

        metric_dict = dict.fromkeys(self._metric_names, 0.0)
        file_writer = self.experiment._get_file_writer()  # noqa: SLF001 - as in _start_session
        for summary in hparams(dict(self._hparams), metric_dict):
            file_writer.add_summary(summary)
        self._has_pending_hparams = False


def _wait_for_a_later_file_name(log_dir: str) -> None:
    """Sleep (under a second) until a new event file's name sorts after the folder's others.

    TensorBoard reads a folder's files in name order, and a name starts with the second the
    file was opened in (then host and pid): a run resumed in the second the interrupted run
    opened its file could sort first, and its ``SessionLog.START`` would then not supersede
    the interrupted run's later points.
    """
    seconds = [
        int(parts[3])
        for parts in (name.split(".") for name in os.listdir(log_dir))
        if _is_event_file_name(parts)
    ]
    if seconds:
        time.sleep(min(1.0, max(0.0, max(seconds) + 1 - time.time())))


def _is_event_file_name(parts: list[str]) -> bool:
    """``events.out.tfevents.<seconds>.<host>...`` split on dots."""
    return len(parts) > 4 and parts[:3] == ["events", "out", "tfevents"] and parts[3].isdigit()


def _check_installed() -> None:
    """Fail at construction, not at the first write, when tensorboard is missing."""
    if not is_available("tensorboard"):
        require("tensorboard", extra="tensorboard", feature="TensorBoardLogger")


def _check_arguments(
    save_dir: object, name: object, version: object, prefix: object, sub_dir: object
) -> None:
    """Reject bad constructor arguments before anything is resolved or written."""

    check_folder_arguments("TensorBoardLogger", save_dir, name, version, prefix)
    if sub_dir is not None and not isinstance(sub_dir, (str, os.PathLike)):
        raise argument_error(
            "TensorBoardLogger",
            "sub_dir",
            sub_dir,
            "a str, os.PathLike or None",
            "Pass e.g. 'fold_1'.",
        )


def _hparams_values(params: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """What the hparams plugin stores (bool, int, float, str); anything else as its ``str()``."""
    values: dict[str, bool | int | float | str] = {}
    for key, value in params.items():
        if hasattr(value, "numel") and value.numel() == 1:
            value = value.item()
        values[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return values
