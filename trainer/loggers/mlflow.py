"""The MLflow logger: one MLflow run per fit, in a local folder, a database or on a server.

This module owns the logger's arguments, when the run starts (at the first write, so
``import trainer`` never imports mlflow), metrics buffered and written with ``log_batch`` (one
request per flush, not one per value), parameters, the run's final status, checkpoint
directories as artifacts, and the run id that a checkpoint records so a resumed fit continues
the same run. The tracking URI (a folder, ``file:``, ``sqlite:///...`` or a server URL), the
``mlflow.tracking.MlflowClient`` and creating or reopening the experiment and run live in
``trainer/loggers/_mlflow_store.py``. It does not decide when metrics are logged or what they
are called (the Trainer does), nor which rank writes (the Trainer calls loggers on global rank
zero only).

MLflow 3 refuses its folder ("file store") backend unless ``MLFLOW_ALLOW_FILE_STORE=true``;
for a folder or ``file:`` URI this logger sets that variable in the process environment (if
unset), and leaves it alone for databases and servers.

Durability: a relative folder, ``file:`` or ``sqlite:///`` URI is made absolute when the logger
is built (a later ``os.chdir`` does not move the store); a local store is checked for write
access before MLflow opens it (MLflow retries a read-only sqlite file for about 100 s);
`MLFlowLogger.state_dict` (called when a checkpoint is saved) writes the queued metrics, so a
run killed after a checkpoint holds every point up to it; a run reopened from a checkpoint
warns about the points the interrupted run wrote after it (MLflow cannot delete them), and a
run id read from a checkpoint is checked against MLflow's run id format.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import time
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer._imports import is_available, require
from trainer.errors import CheckpointError, ConfigurationError, describe
from trainer.loggers._mlflow_store import (
    absolute_uri,
    create_run,
    file_store_path,
    make_client,
    reopen_run,
)
from trainer.loggers.logger import Logger, metric_as_float, resolve_step
from trainer.loggers.params import as_dict, flatten_params
from trainer.loggers.uploads import checkpoints_to_log

__all__ = ["MLFlowLogger"]

_STATUSES = {"success": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_MAX_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch request
_MAX_PARAMS_PER_BATCH = 100
_INVALID_NAME_CHARS = re.compile(r"[^\w/.\- :]")  # what MLflow accepts in metric/param names
_RUN_ID = re.compile(r"[A-Za-z0-9][\w\-]{0,255}", re.ASCII)  # MLflow's own run id check


class MLFlowLogger(Logger):
    """Log metrics, parameters and checkpoints to an MLflow run.

    At the first write the logger gets or creates the experiment ``experiment_name`` and
    creates a run in it (named ``run_name``, tagged with ``tags``), or reopens ``run_id``.
    Metrics are kept in memory and written with one ``log_batch`` call every
    ``flush_interval_s`` seconds (checked when metrics arrive), when 1,000 are waiting, in
    `save` / `finalize`, `state_dict` (each checkpoint), and when the interpreter exits; a
    killed process loses at most that interval, and never a point its last checkpoint
    covers. `finalize` sets the run's status: FINISHED on success, FAILED on failure,
    KILLED when interrupted.

    Args:
        experiment_name: the MLflow experiment (created if missing).
        run_name: the run's name (MLflow picks one when None).
        tracking_uri: where runs are stored: a folder or ``file:`` URI (MLflow's file store),
            ``sqlite:///path/to/mlflow.db`` (or another database URL), or a server URL such as
            ``http://localhost:5000``. None: the ``MLFLOW_TRACKING_URI`` environment variable,
            else the folder ``save_dir``. Relative local paths are made absolute now.
        tags: tags of a new run.
        save_dir: the file store folder used when ``tracking_uri`` is None.
        log_model: False: no checkpoints are uploaded; True: the ModelCheckpoint's checkpoints
            (best, top-k, last) are uploaded when fit succeeds, or each as it is saved with
            ``save_top_k=-1``; ``"all"``: each as it is saved. They go to the run's artifacts as
            ``checkpoints/<checkpoint folder name>/``.
        prefix: put before every metric name, joined with ``"-"``.
        artifact_location: where a new experiment stores artifacts (MLflow's default when None;
            a relative folder is made absolute now).
        run_id: reopen this run instead of creating one.
        flush_interval_s: the longest time metrics wait in memory before they are written.
        synchronous: Lightning's argument, passed to each ``log_batch``: False lets MLflow
            write the periodic batches on its own thread (training does not wait for the
            store); `state_dict` (each checkpoint) and `finalize` still wait until everything
            queued is written. None: MLflow's default (``MLFLOW_ENABLE_ASYNC_LOGGING``).

    Raises:
        ConfigurationError: an argument has the wrong type or value; at the first write, a
            local store (folder or sqlite file) that cannot be written.
        MissingDependencyError: mlflow is not installed (``pip install 'trainer[mlflow]'``).

    Examples:
        >>> logger = MLFlowLogger("mnist", tracking_uri="sqlite:///mlflow.db")  # doctest: +SKIP
        >>> logger.log_hyperparams({"lr": 0.1})  # doctest: +SKIP
        >>> logger.log_metrics({"loss": 0.25}, step=10)  # doctest: +SKIP
        >>> logger.finalize("success")  # doctest: +SKIP
        >>> logger.experiment.get_metric_history(logger.run_id, "loss")[0].step  # doctest: +SKIP
        10
    """

    tracker_name = "mlflow"
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        experiment_name: str = "trainer_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, Any] | None = None,
        save_dir: str | os.PathLike[str] | None = "./mlruns",
        log_model: bool | str = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        flush_interval_s: float = 5.0,
        synchronous: bool | None = None,
    ) -> None:
        _check_arguments(experiment_name, tracking_uri, tags, log_model, prefix, flush_interval_s)
        if synchronous is not None and not isinstance(synchronous, bool):
            raise ConfigurationError(
                f"MLFlowLogger(synchronous={describe(synchronous)}): expected True, False or "
                "None. Pass synchronous=False to let MLflow write on its own thread."
            )
        _check_installed()
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        if tracking_uri is None:
            if save_dir is None:
                raise ConfigurationError(
                    "MLFlowLogger needs a tracking_uri or a save_dir, received neither. Pass "
                    "e.g. tracking_uri='sqlite:///mlflow.db' or save_dir='./mlruns'."
                )
            tracking_uri = Path(save_dir).resolve().as_uri()
        self._tracking_uri = absolute_uri(tracking_uri)
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._tags = {str(key): str(value) for key, value in (tags or {}).items()}
        self._log_model = log_model
        self._prefix = prefix
        self._artifact_location = (
            absolute_uri(artifact_location) if artifact_location is not None else None
        )
        self._run_id = run_id
        self._is_run_id_given = run_id is not None
        self._is_run_from_checkpoint = False
        self._checkpoint_step: int | None = None  # last step logged when it was saved
        self._flush_interval_s = flush_interval_s
        self._synchronous = synchronous
        self._operations: list[Any] = []  # MLflow's handles of writes still running (async)
        self._client: Any = None
        self._experiment_id: str | None = None
        self._pending: list[tuple[str, float, int, int]] = []  # key, value, timestamp ms, step
        self._last_flush = time.monotonic()
        self._is_flushed_at_exit = False  # an atexit hook writes what is still queued
        self._last_step: int | None = None
        self._names: dict[str, str] = {}  # metric name -> the name MLflow accepts
        self._checkpoint_callback: Any = None
        self._logged_checkpoints: dict[str, float] = {}

    # ---- where ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The experiment name."""
        return self._experiment_name

    @property
    def version(self) -> str:
        """The run id (starts the run, as Lightning's does)."""
        return self.run_id

    @property
    def run_id(self) -> str:
        """The run id; starts the run at first use."""
        _ = self.experiment
        return str(self._run_id)

    @property
    def experiment_id(self) -> str:
        """The experiment id; starts the run at first use."""
        _ = self.experiment
        return str(self._experiment_id)

    @property
    def tracking_uri(self) -> str:
        """Where runs are stored, as MLflow receives it."""
        return self._tracking_uri

    @property
    def save_dir(self) -> str | None:
        """The file store's folder, or None for databases and servers."""
        return file_store_path(self._tracking_uri)

    @property
    def log_dir(self) -> str | None:
        """Same as ``save_dir``."""
        return self.save_dir

    @property
    def experiment(self) -> Any:
        """The ``mlflow.tracking.MlflowClient``; creates the experiment and run at first use."""
        if self._client is None:
            client = make_client(self._tracking_uri)
            self._open_run(client)
            self._client = client
        return self._client

    def _open_run(self, client: Any) -> None:
        """Reopen ``run_id`` (marking it RUNNING) or create a run in the named experiment."""
        if self._run_id is not None:
            experiment_id = reopen_run(
                client,
                self._run_id,
                tracking_uri=self._tracking_uri,
                is_from_checkpoint=self._is_run_from_checkpoint,
                checkpoint_step=self._checkpoint_step,
            )
            if experiment_id is not None:
                self._experiment_id = experiment_id
                return
        self._experiment_id, self._run_id = create_run(
            client,
            experiment_name=self._experiment_name,
            tracking_uri=self._tracking_uri,
            artifact_location=self._artifact_location,
            tags=self._tags,
            run_name=self._run_name,
        )

    # ---- what ----------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Queue ``metrics`` at ``step``; write the queue when it is due (see the class doc).

        Names keep only the characters MLflow accepts (letters, digits, ``_ - . / : `` and
        space); others are dropped, with a warning the first time.

        Args:
            metrics: metric name -> number; 0-dim tensors are read with ``float()``.
            step: the global step; None means one past the last step logged (0 at first).

        Raises:
            ConfigurationError: a value is not a number, or ``step`` is not an int.

        Examples:
            >>> logger.log_metrics({"train/loss": 0.5}, step=50)  # doctest: +SKIP
            >>> logger.save()  # doctest: +SKIP   # one log_batch request
        """
        step = resolve_step("MLFlowLogger", step, self._last_step)
        timestamp = int(time.time() * 1000)
        if not self._is_flushed_at_exit:
            atexit.register(_save_at_exit, weakref.ref(self))
            self._is_flushed_at_exit = True
        for key, value in metrics.items():
            self._pending.append(
                (self._name_of(key), metric_as_float("MLFlowLogger", key, value), timestamp, step)
            )
        self._last_step = step
        is_due = time.monotonic() - self._last_flush >= self._flush_interval_s
        if is_due or len(self._pending) >= _MAX_METRICS_PER_BATCH:
            self.save()

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Log ``params`` as run parameters, flattened with ``"/"`` and stored as ``str()``.

        Values longer than MLflow's limit (6,000 characters) are truncated. MLflow parameters
        cannot change: on a reopened run, a parameter already logged with another value keeps
        its first value (with a warning).

        Raises:
            ConfigurationError: ``params`` is neither a mapping nor a Namespace.
        """
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        flat = flatten_params(as_dict(params, "MLFlowLogger.log_hyperparams"))
        values = {
            self._name_of(key): str(value)[:MAX_PARAM_VAL_LENGTH] for key, value in flat.items()
        }
        client = self.experiment
        existing = client.get_run(self._run_id).data.params
        changed = sorted(k for k, v in values.items() if k in existing and existing[k] != v)
        if changed:
            warnings.warn(
                f"MLFlowLogger: run {self._run_id} already has the parameters {changed} with "
                "other values; MLflow parameters cannot change, so the first values are kept.",
                stacklevel=2,
            )
        new = [Param(key, value) for key, value in values.items() if key not in existing]
        for start in range(0, len(new), _MAX_PARAMS_PER_BATCH):
            client.log_batch(self._run_id, params=new[start : start + _MAX_PARAMS_PER_BATCH])

    def save(self) -> None:
        """Write the queued metrics (one ``log_batch`` per 1,000); with ``synchronous=False``
        MLflow finishes them on its own thread (`state_dict` and `finalize` wait for them)."""
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        from mlflow.entities import Metric

        client = self.experiment
        metrics = [Metric(key, value, time_ms, step) for key, value, time_ms, step in self._pending]
        options = {} if self._synchronous is None else {"synchronous": self._synchronous}
        for start in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            batch = metrics[start : start + _MAX_METRICS_PER_BATCH]
            operation = client.log_batch(self._run_id, metrics=batch, **options)
            if operation is not None:  # an asynchronous write
                self._operations.append(operation)
        # Dropped only once written: a failed request keeps them for the next try (MLflow stores
        # a point sent twice once).
        del self._pending[: len(metrics)]

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Upload new checkpoints now (``log_model="all"``) or remember them for the end (True)."""
        if not self._log_model:
            return
        if self._log_model == "all" or getattr(checkpoint_callback, "save_top_k", None) == -1:
            self._upload_checkpoints(checkpoint_callback)
        else:
            self._checkpoint_callback = checkpoint_callback

    def finalize(self, status: str) -> None:
        """Write the queued metrics, upload remembered checkpoints (on success), set the status."""
        has_uploads = status == "success" and self._checkpoint_callback is not None
        if self._client is None and not self._pending and not has_uploads:
            return  # never started: nothing to close
        self.save()
        self._wait_for_writes()
        if has_uploads:
            self._upload_checkpoints(self._checkpoint_callback)
        self.experiment.set_terminated(self._run_id, status=_STATUSES.get(status, "FAILED"))

    def _wait_for_writes(self) -> None:
        """Wait until MLflow has written every asynchronous batch (and raise its error if one
        failed), so a checkpoint or the end of the run never precedes its points."""
        operations, self._operations = self._operations, []
        for operation in operations:
            operation.wait()

    # ---- resuming ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Write the queued metrics, then return the experiment name, run id and last ``step``.

        Called when a checkpoint is saved, before it is written: every point the checkpoint
        covers is in the store by the time the checkpoint exists. Starts the run only when
        metrics are queued (the run id is None before).
        """
        self.save()
        self._wait_for_writes()
        return {"name": self._experiment_name, "version": self._run_id, "step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Reopen the saved run (unless a run id was given or a run already started).

        Raises:
            CheckpointError: the saved run id is not an MLflow run id (a letter or digit, then
                up to 255 letters, digits, ``_`` or ``-``), or the saved step is not an int.
        """
        saved, step = state_dict.get("version"), state_dict.get("step")
        if saved is not None and (not isinstance(saved, str) or not _RUN_ID.fullmatch(saved)):
            raise CheckpointError(
                f"the checkpoint's MLFlowLogger state, field 'version': expected an MLflow run "
                f"id (a letter or digit, then up to 255 letters, digits, '_' or '-'), received "
                f"{describe(saved)}. The checkpoint is corrupt or was not written by trainer; "
                "use another checkpoint, or pass MLFlowLogger(run_id=...)."
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise CheckpointError(
                f"the checkpoint's MLFlowLogger state, field 'step': expected an int or None, "
                f"received {describe(step)}. The checkpoint is corrupt; use another."
            )
        if not self._is_run_id_given and saved is not None and self._client is None:
            self._run_id = saved
            self._is_run_from_checkpoint = True
            self._checkpoint_step = step

    # ---- helpers -------------------------------------------------------------------------------
    def _upload_checkpoints(self, checkpoint_callback: Any) -> None:
        client = self.experiment
        for path, _score, _aliases in checkpoints_to_log(
            checkpoint_callback, self._logged_checkpoints
        ):
            folder = f"checkpoints/{os.path.basename(path)}"
            if os.path.isdir(path):
                client.log_artifacts(self._run_id, path, artifact_path=folder)
            else:
                client.log_artifact(self._run_id, path, artifact_path="checkpoints")
            self._logged_checkpoints[path] = os.path.getmtime(path)

    def _name_of(self, key: str) -> str:
        """The prefixed name with the characters MLflow rejects dropped (cached: runs per value)."""
        name = self._names.get(key)
        if name is None:
            full = f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key
            name = _INVALID_NAME_CHARS.sub("", full)
            if name != full:
                warnings.warn(
                    f"MLFlowLogger: {full!r} has characters MLflow rejects; logged as {name!r}.",
                    stacklevel=3,
                )
            self._names[key] = name
        return name


def _save_at_exit(reference: weakref.ReferenceType[MLFlowLogger]) -> None:
    """Write the metrics still queued when the interpreter exits without ``finalize``."""
    logger = reference()
    if logger is not None:
        logger.save()  # writes nothing when nothing is queued
        logger._wait_for_writes()  # noqa: SLF001 - this module's own logger


def _check_installed() -> None:
    """Fail at construction, not at the first write, when mlflow is missing."""
    if not is_available("mlflow"):
        require("mlflow", extra="mlflow", feature="MLFlowLogger")


def _check_arguments(
    experiment_name: object,
    tracking_uri: object,
    tags: object,
    log_model: object,
    prefix: object,
    flush_interval_s: object,
) -> None:
    """Reject bad constructor arguments before anything is started."""

    def fail(argument: str, value: object, expected: str, fix: str) -> ConfigurationError:
        return ConfigurationError(
            f"MLFlowLogger expected {argument} to be {expected}, received {describe(value)}. {fix}"
        )

    if not isinstance(experiment_name, str) or not experiment_name:
        raise fail("experiment_name", experiment_name, "a non-empty str", "Pass e.g. 'mnist'.")
    if tracking_uri is not None and not isinstance(tracking_uri, str):
        raise fail(
            "tracking_uri", tracking_uri, "a str or None", "Pass e.g. 'sqlite:///mlflow.db'."
        )
    if tags is not None and not isinstance(tags, Mapping):
        raise fail("tags", tags, "a dict or None", "Pass e.g. tags={'team': 'vision'}.")
    if log_model not in (True, False, "all"):
        raise fail("log_model", log_model, "True, False or 'all'", "Pass e.g. log_model='all'.")
    if not isinstance(prefix, str):
        raise fail("prefix", prefix, "a str", "Pass e.g. prefix='train'.")
    if (
        isinstance(flush_interval_s, bool)
        or not isinstance(flush_interval_s, (int, float))
        or flush_interval_s < 0
    ):
        raise fail("flush_interval_s", flush_interval_s, "a number >= 0", "Pass e.g. 5.0.")
