"""Where an MLFlowLogger writes: the tracking URI, the client, and the experiment and run in it.

This module owns the tracking URI as the logger keeps it (a relative folder, ``file:`` or
``sqlite:///`` path made absolute, so a later ``os.chdir`` does not move the store), the write
check of a local store before MLflow opens it, the ``MlflowClient`` (with
``MLFLOW_ALLOW_FILE_STORE`` set for a folder store), and finding the run: reopening a run id, or
getting the experiment and creating a run in it. It does not buffer or write metrics, parameters
or artifacts, and does not decide which run id to reopen (``trainer/loggers/mlflow.py`` does).
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.parse
import warnings
from pathlib import Path
from typing import Any

from trainer._imports import require
from trainer.errors import ConfigurationError

__all__ = ["absolute_uri", "create_run", "file_store_path", "make_client", "reopen_run"]

_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
_SQLITE_PATH = re.compile(r"(sqlite(?:\+\w+)?:///)([^?]*)(\?.*)?")  # prefix, path, query


def make_client(tracking_uri: str) -> Any:
    """An ``mlflow.tracking.MlflowClient`` for ``tracking_uri``, once its store is known usable.

    Raises:
        MissingDependencyError: mlflow (or, for a database, sqlalchemy/alembic) is missing.
        ConfigurationError: a local store (folder or sqlite file) cannot be written.
    """
    require("mlflow", extra="mlflow", feature="MLFlowLogger")
    scheme = urllib.parse.urlparse(tracking_uri).scheme.split("+")[0]
    if scheme in _DATABASE_SCHEMES:
        for module in ("sqlalchemy", "alembic"):
            require(module, extra="mlflow", feature=f"MLFlowLogger({scheme} tracking_uri)")
    _check_store_writable(tracking_uri)
    if file_store_path(tracking_uri) is not None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def reopen_run(
    client: Any,
    run_id: str,
    *,
    tracking_uri: str,
    is_from_checkpoint: bool,
    checkpoint_step: int | None,
) -> str | None:
    """Mark ``run_id`` RUNNING and return its experiment id; None when a checkpoint's run is gone.

    A run reopened from a checkpoint saved at ``checkpoint_step`` warns about the points it
    holds after that step (MLflow cannot delete them) and those it lacks before it.

    Raises:
        ConfigurationError: a run id the user gave is not in the store.
    """
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        if not is_from_checkpoint:
            raise ConfigurationError(
                f"MLFlowLogger(run_id={run_id!r}): no such run at "
                f"{tracking_uri} ({err}). Pass an existing run id, or None."
            ) from err
        warnings.warn(
            f"MLFlowLogger: the checkpoint's run {run_id} is not in "
            f"{tracking_uri}; starting a new run.",
            stacklevel=4,  # the code that first used the logger's experiment
        )
        return None
    client.update_run(run_id, status="RUNNING")
    if is_from_checkpoint and checkpoint_step is not None:
        _warn_about_points_after(client, run_id, checkpoint_step)
    return run.info.experiment_id


def create_run(
    client: Any,
    *,
    experiment_name: str,
    tracking_uri: str,
    artifact_location: str | None,
    tags: dict[str, str],
    run_name: str | None,
) -> tuple[str, str]:
    """``(experiment id, run id)`` of a new run in ``experiment_name`` (created if missing).

    Raises:
        ConfigurationError: the experiment is deleted (MLflow keeps its name reserved).
    """
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        experiment_id = client.create_experiment(
            experiment_name, artifact_location=artifact_location
        )
    elif experiment.lifecycle_stage == "deleted":
        raise ConfigurationError(
            f"MLFlowLogger(experiment_name={experiment_name!r}): the experiment is "
            f"deleted in {tracking_uri}. Restore it (client.restore_experiment), "
            f"delete it permanently, or pick another name."
        )
    else:
        experiment_id = experiment.experiment_id
    run = client.create_run(experiment_id, tags=tags, run_name=run_name)
    return experiment_id, run.info.run_id


def _warn_about_points_after(client: Any, run_id: str, checkpoint_step: int) -> None:
    """Say which steps the reopened run holds past the checkpoint (MLflow cannot delete them)
    and which it lacks before it (queued when the process stopped)."""
    steps: set[int] = set()
    for key in client.get_run(run_id).data.metrics:
        steps.update(metric.step for metric in client.get_metric_history(run_id, key))
    after = sorted(step for step in steps if step > checkpoint_step)
    if after:
        warnings.warn(
            f"MLFlowLogger: run {run_id} already holds points logged after step "
            f"{checkpoint_step}, the last step of the checkpoint being resumed (steps "
            f"{after[0]} to {after[-1]}, {len(after)} steps, written before the process "
            "stopped). MLflow cannot delete metric points: the steps logged again will hold "
            "two values each (tell them apart by timestamp).",
            stacklevel=6,
        )
    if checkpoint_step not in steps:
        last = max((step for step in steps if step < checkpoint_step), default=None)
        held = f"ends at step {last}" if last is not None else "holds no points"
        warnings.warn(
            f"MLFlowLogger: run {run_id} {held}, but the checkpoint being resumed was saved "
            f"after step {checkpoint_step} was logged: the points logged up to step "
            f"{checkpoint_step} after that were lost (still queued when the process stopped) "
            "and are not logged again. Checkpoints written by this version write them first.",
            stacklevel=6,
        )


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute (plain folder, ``file:``, ``sqlite:///``).

    MLflow resolves such paths against the working directory at each use, so a run built in one
    folder would land in another after an ``os.chdir``.
    """
    sqlite = _SQLITE_PATH.fullmatch(uri)
    if sqlite is not None:
        prefix, path, query = sqlite.group(1), sqlite.group(2), sqlite.group(3) or ""
        if path in ("", ":memory:") or os.path.isabs(path):
            return uri
        return f"{prefix}{os.path.abspath(path)}{query}"
    parsed = urllib.parse.urlparse(uri)
    path = file_store_path(uri)
    if path is None or os.path.isabs(path):
        return uri
    if parsed.scheme == "file":
        return Path(os.path.abspath(path)).as_uri()
    return os.path.abspath(path)


def file_store_path(uri: str) -> str | None:
    """The folder of a file-store URI (a plain path or ``file:``), else None."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        from urllib.request import url2pathname

        return url2pathname(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):  # C:\... on Windows
        return uri
    return None


def _local_store_path(uri: str) -> tuple[str, str] | None:
    """``(folder to write in, what it is)`` of a local store: a file-store folder or the folder
    of a sqlite file; None for servers, other databases and in-memory sqlite."""
    sqlite = _SQLITE_PATH.fullmatch(uri)
    if sqlite is not None:
        path = sqlite.group(2)
        if path in ("", ":memory:"):
            return None
        return os.path.dirname(os.path.abspath(path)), f"the sqlite database {path!r}"
    folder = file_store_path(uri)
    return (folder, f"the file store {folder!r}") if folder is not None else None


def _check_store_writable(uri: str) -> None:
    """Create and remove a file in a local store's folder before MLflow opens it.

    MLflow retries a sqlite database it cannot write for about 100 s before failing; as root,
    permission bits say nothing (os.access is True), so only a real write tells.

    Raises:
        ConfigurationError: naming the tracking URI, the folder and the OS error.
    """
    local = _local_store_path(uri)
    if local is None:
        return
    folder, what = local
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".trainer-write-check-"):
            pass
        sqlite = _SQLITE_PATH.fullmatch(uri)
        if sqlite is not None and os.path.exists(sqlite.group(2)):
            os.close(os.open(sqlite.group(2), os.O_RDWR))
    except OSError as err:
        raise ConfigurationError(
            f"MLFlowLogger(tracking_uri={uri!r}): cannot write {what} in the folder "
            f"{folder!r} ({err.strerror or err}; errno {err.errno}). The disk is read-only or "
            "the path is not a writable folder. Pass a tracking_uri on a writable disk, e.g. "
            "tracking_uri='sqlite:////tmp/mlflow.db' or save_dir='./mlruns'."
        ) from err
