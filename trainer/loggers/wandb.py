"""The Weights & Biases logger: one wandb run per fit, online or offline, resumable by id.

This module owns starting the run (``wandb.init``, at the first write, so ``import trainer``
never imports wandb), the step axis (every row carries ``trainer/global_step``, and every metric
is plotted against it), the config, checkpoint directories as ``model`` artifacts, and the run
id that a checkpoint records so a resumed fit continues the same run. It does not decide when
metrics are logged or what they are called (the Trainer does), nor which rank writes (the
Trainer calls loggers on global rank zero only).

wandb's own ``_step`` counts ``log`` calls; this logger never passes ``step=`` to
``wandb.log``, so a resumed run can log a ``trainer/global_step`` lower than the last one the
interrupted run reached without wandb's "step must only increase" warning and dropped rows.

``save_dir`` is made absolute when the logger is built: wandb's service process would resolve a
relative one against its own working directory. A run id read from a checkpoint is checked
before wandb puts it in a folder name.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import secrets
import string
import warnings
from collections.abc import Mapping
from typing import Any, Literal

from trainer._imports import is_available, require
from trainer.errors import CheckpointError, ConfigurationError, describe
from trainer.loggers.logger import Logger, resolve_step
from trainer.loggers.params import to_yaml_safe
from trainer.loggers.uploads import checkpoints_to_log

__all__ = ["WandbLogger"]

STEP_METRIC = "trainer/global_step"
_EXIT_CODES = {"success": 0, "failed": 1, "interrupted": 130}  # 130: killed by SIGINT
_ID_ALPHABET = string.ascii_lowercase + string.digits
_WANDB_FILE_HEADER_LEN = 7  # ":W&B", magic, version: an offline file with no record yet
_RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")  # what a checkpoint may restore


class WandbLogger(Logger):
    """Log metrics, hyperparameters and checkpoints to a Weights & Biases run.

    The run starts at the first write with ``wandb.init(project=project, name=name, id=id,
    resume="allow", dir=save_dir, mode="offline" if offline)`` plus ``**kwargs``. Each
    `log_metrics` call is one history row that also holds ``trainer/global_step``; every
    metric uses it as its x axis (``define_metric("*", step_metric="trainer/global_step")``).
    Hyperparameters go to ``run.config``. `finalize` finishes the run (exit code 0 on
    success, 1 on failure, 130 when interrupted) unless it was started outside this logger.

    Offline, wandb writes ``<save_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb``; upload it
    later with ``wandb sync``. If a wandb run is already active (``wandb.init`` called by the
    user), this logger logs to it, and leaves finishing it to the user.

    Args:
        name: the run's display name (wandb picks one when None).
        save_dir: the folder wandb writes its ``wandb/`` folder into.
        version: the run id; same as ``id`` (Lightning's name). Resumes that run if it exists.
        offline: write locally only (``mode="offline"``).
        dir: same as ``save_dir`` (``wandb.init``'s name); wins when given.
        id: the run id (8+ characters of ``[a-z0-9]`` by convention); None generates one
            when first needed, so a checkpoint can record it before the run starts.
        anonymous: True allows anonymous logging (passed as ``anonymous="allow"``).
        project: the wandb project; None reads ``WANDB_PROJECT``, else ``"trainer_logs"``.
        log_model: False: no checkpoints are uploaded; True: the checkpoints of the
            ModelCheckpoint (best, top-k, last) are uploaded when fit succeeds, or each as it is
            saved with ``save_top_k=-1``; ``"all"``: each as it is saved.
        prefix: put before every metric name, joined with ``"-"``.
        checkpoint_name: the artifact name; default ``"model-<run id>"``.
        experiment: a wandb Run started by the caller, to log to instead of starting one; it
            is the caller's to finish.
        add_file_policy: how checkpoint files join their artifact: ``"mutable"`` (copied to a
            staging folder first, safe if the file changes later) or ``"immutable"`` (read in
            place: no copy).
        **kwargs: more ``wandb.init`` arguments (``entity``, ``tags``, ``group``, ``notes``,
            ``settings``, ...); they override the ones above.

    Raises:
        ConfigurationError: an argument has the wrong type or value.
        MissingDependencyError: wandb is not installed (``pip install 'trainer[wandb]'``).

    Examples:
        >>> logger = WandbLogger(project="mnist", offline=True)  # doctest: +SKIP
        >>> logger.log_hyperparams({"lr": 0.1})  # doctest: +SKIP
        >>> logger.log_metrics({"loss": 0.25}, step=10)  # doctest: +SKIP
        >>> logger.finalize("success")  # doctest: +SKIP
        >>> # history row: {"loss": 0.25, "trainer/global_step": 10}
    """

    tracker_name = "wandb"
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike[str] = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike[str] | None = None,  # wandb.init's name, shadows the builtin
        id: str | None = None,  # wandb.init's name, shadows the builtin
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: bool | str = False,
        prefix: str = "",
        checkpoint_name: str | None = None,
        experiment: Any = None,
        add_file_policy: Literal["mutable", "immutable"] = "mutable",
        **kwargs: Any,
    ) -> None:
        run_id = version if version is not None else id
        _check_arguments(save_dir, dir, run_id, log_model, prefix)
        if add_file_policy not in ("mutable", "immutable"):
            raise ConfigurationError(
                f"WandbLogger(add_file_policy={describe(add_file_policy)}): expected 'mutable' "
                "(checkpoint files are copied before upload) or 'immutable' (read in place)."
            )
        _check_installed()
        # Absolute now: wandb's service process resolves a relative dir against its own working
        # directory, so after an os.chdir a run's .wandb file would be written nowhere.
        self._save_dir = os.path.abspath(os.fspath(dir if dir is not None else save_dir))
        self._run_name = name
        self._project = project or os.environ.get("WANDB_PROJECT") or "trainer_logs"
        self._id = run_id
        self._is_id_given = run_id is not None
        self._offline = offline
        self._anonymous = anonymous
        self._log_model = log_model
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self._add_file_policy = add_file_policy
        self._init_kwargs = kwargs
        self._given_experiment = experiment  # the caller's run: never finished here
        self._experiment: Any = experiment
        self._is_run_owned = False
        self._is_axis_defined = False
        self._last_step: int | None = None
        self._checkpoint_callback: Any = None
        self._logged_checkpoints: dict[str, float] = {}  # path -> mtime when uploaded

    # ---- where ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The project (Lightning's meaning of ``name`` for this logger)."""
        return self._project

    @property
    def version(self) -> str:
        """The run id: the active run's, else the given one, else one generated now (no wandb)."""
        if self._experiment is not None:
            return str(self._experiment.id)
        if self._id is None:
            self._id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))
        return self._id

    @property
    def save_dir(self) -> str:
        """The folder wandb writes its ``wandb/`` folder into."""
        return self._save_dir

    @property
    def log_dir(self) -> str:
        """Same as ``save_dir`` (the run's own folder is named by wandb when it starts)."""
        return self._save_dir

    @property
    def experiment(self) -> Any:
        """The ``wandb`` Run, started at first use (or the user's active run)."""
        if self._experiment is None:
            wandb = require("wandb", extra="wandb", feature="WandbLogger")
            if wandb.run is not None:
                warnings.warn(
                    f"WandbLogger: a wandb run is already active (id {wandb.run.id}); logging to "
                    "it. Call wandb.finish() first to let the logger start its own run.",
                    stacklevel=2,
                )
                self._experiment, self._is_run_owned = wandb.run, False
            else:
                os.makedirs(self._save_dir, exist_ok=True)
                self._experiment, self._is_run_owned = wandb.init(**self._wandb_init()), True
        if not self._is_axis_defined:
            self._experiment.define_metric(STEP_METRIC)
            self._experiment.define_metric("*", step_metric=STEP_METRIC, step_sync=True)
            self._is_axis_defined = True
        return self._experiment

    def _wandb_init(self) -> dict[str, Any]:
        """The ``wandb.init`` arguments: this logger's, then the user's ``**kwargs`` on top."""
        arguments: dict[str, Any] = {
            "project": self._project,
            "name": self._run_name,
            "id": self.version,
            "resume": "allow",
            "dir": self._save_dir,
        }
        if self._offline:
            arguments["mode"] = "offline"
        if self._anonymous is not None:
            arguments["anonymous"] = "allow" if self._anonymous else "never"
        arguments.update(self._init_kwargs)
        return arguments

    # ---- what ----------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log one history row: ``metrics`` plus ``trainer/global_step = step``.

        Args:
            metrics: metric name -> value; one-element tensors are read with ``float()``, other
                values (numbers, ``wandb.Image``, ...) go to wandb as they are.
            step: the global step; None means one past the last step logged (0 at first).

        Raises:
            ConfigurationError: ``step`` is not an int.

        Examples:
            >>> logger.log_metrics({"train/loss": 0.5}, step=50)  # doctest: +SKIP
            >>> # row: {"train/loss": 0.5, "trainer/global_step": 50}
        """
        self._log_row(metrics, step)

    def _log_row(self, metrics: Mapping[str, Any], step: int | None, **kwargs: Any) -> None:
        step = resolve_step("WandbLogger", step, self._last_step)
        row = {self._key(key): _to_value(value) for key, value in metrics.items()}
        row[STEP_METRIC] = step
        self.experiment.log(row, **kwargs)
        self._last_step = step

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Accelerate's ``tracker.log``: every value goes to wandb as it is (one-element tensors
        read), as Accelerate's W&B tracker passes them to ``run.log``: a str, a dict (nested
        keys), a ``wandb.Image``. ``step`` None: one past the last step. ``kwargs`` go to
        ``run.log`` (``commit=False``: the next call adds to the same row), as Accelerate's."""
        self._log_row(values, step, **kwargs)

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Merge ``params`` into ``run.config`` (later values replace earlier ones).

        Values wandb cannot store as JSON (paths, classes, tensors, ...) are stored as their
        ``str()``; tuples and sets become lists.

        Raises:
            ConfigurationError: ``params`` is neither a mapping nor a Namespace.
        """
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        if not isinstance(params, Mapping):
            raise ConfigurationError(
                f"WandbLogger.log_hyperparams expected a dict or an argparse.Namespace, received "
                f"{describe(params)}. Pass e.g. {{'lr': 0.1}}."
            )
        self.experiment.config.update(to_yaml_safe(dict(params)), allow_val_change=True)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Upload new checkpoints now (``log_model="all"``) or remember them for the end (True)."""
        if not self._log_model:
            return
        if self._log_model == "all" or getattr(checkpoint_callback, "save_top_k", None) == -1:
            self._upload_checkpoints(checkpoint_callback)
        else:
            self._checkpoint_callback = checkpoint_callback

    def finalize(self, status: str) -> None:
        """Upload remembered checkpoints (on success), then finish the run this logger started."""
        if status == "success" and self._checkpoint_callback is not None:
            self._upload_checkpoints(self._checkpoint_callback)
        if self._experiment is not None and self._is_run_owned:
            self._experiment.finish(exit_code=_EXIT_CODES.get(status, 1))
        if self._experiment is not self._given_experiment:  # a given run stays this logger's
            self._experiment = None
            self._is_axis_defined = False

    # ---- resuming ------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the saved run id (unless an id was given or the run already started).

        Raises:
            CheckpointError: the saved id is not 1-128 characters of letters, digits, ``_``,
                ``-`` and ``.`` (not starting with ``.``): wandb puts it in folder names.
        """
        saved = state_dict.get("version")
        if saved is None:
            return
        if not isinstance(saved, str) or _RUN_ID.fullmatch(saved) is None:
            raise CheckpointError(
                f"the checkpoint's WandbLogger state, field 'version': expected a wandb run id "
                f"(1-128 letters, digits, '_', '-' or '.', not starting with '.'), received "
                f"{describe(saved)}. The checkpoint is corrupt or was not written by trainer; "
                "use another checkpoint, or pass WandbLogger(id=...)."
            )
        if not self._is_id_given and self._experiment is None:
            self._id = saved
            step = state_dict.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and self._is_offline():
                _warn_if_offline_file_is_empty(self._save_dir, saved, step)

    def state_dict(self) -> dict[str, Any]:
        """The project, the run id and the last ``step`` logged (what a checkpoint records)."""
        return {"name": self.name, "version": self.version, "step": self._last_step}

    def _is_offline(self) -> bool:
        mode = self._init_kwargs.get("mode") or os.environ.get("WANDB_MODE")
        return self._offline or mode in ("offline", "dryrun")

    # ---- helpers -------------------------------------------------------------------------------
    def _upload_checkpoints(self, checkpoint_callback: Any) -> None:
        """One ``model`` artifact version per checkpoint not uploaded yet, oldest first."""
        wandb = require("wandb", extra="wandb", feature="WandbLogger(log_model=...)")
        run = self.experiment
        for path, score, aliases in checkpoints_to_log(
            checkpoint_callback, self._logged_checkpoints
        ):
            artifact = wandb.Artifact(
                name=self._checkpoint_name or f"model-{run.id}",
                type="model",
                metadata={
                    "score": score,
                    "original_filename": os.path.basename(path),
                    "ModelCheckpoint": _checkpoint_settings(checkpoint_callback),
                },
            )
            if os.path.isdir(path):
                artifact.add_dir(path, policy=self._add_file_policy)
            else:
                artifact.add_file(path, policy=self._add_file_policy)
            run.log_artifact(artifact, aliases=aliases)
            self._logged_checkpoints[path] = os.path.getmtime(path)

    def _key(self, key: str) -> str:
        return f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key


def _warn_if_offline_file_is_empty(save_dir: str, run_id: str, step: int) -> None:
    """Say so when the interrupted offline run's ``.wandb`` file holds nothing but its header.

    wandb's service writes that file in 32 KiB blocks and stops with a process killed by
    SIGKILL, so a short run killed that way loses every row, up to the checkpoint included.
    """
    pattern = os.path.join(glob.escape(save_dir), "wandb", f"offline-run-*-{run_id}*")
    files = glob.glob(os.path.join(pattern, f"run-{run_id}.wandb"))
    if not files:
        return
    newest = max(files, key=os.path.getmtime)
    if os.path.getsize(newest) > _WANDB_FILE_HEADER_LEN:
        return
    warnings.warn(
        f"WandbLogger: the interrupted offline run {run_id} left {newest} without any record "
        f"(wandb writes it in blocks, and its service stops with a killed process): the rows "
        f"it logged up to step {step}, the checkpoint's, are lost. The resumed run continues "
        "from the checkpoint in a new offline folder with the same id.",
        stacklevel=3,
    )


def _checkpoint_settings(checkpoint_callback: Any) -> dict[str, Any]:
    """The ModelCheckpoint settings recorded with each uploaded checkpoint."""
    names = ("monitor", "mode", "save_top_k", "save_last", "every_n_train_steps", "every_n_epochs")
    return {name: getattr(checkpoint_callback, name, None) for name in names}


def _check_installed() -> None:
    """Fail at construction, not at the first write, when wandb is missing."""
    if not is_available("wandb"):
        require("wandb", extra="wandb", feature="WandbLogger")


def _check_arguments(
    save_dir: object, dir: object, run_id: object, log_model: object, prefix: object
) -> None:
    """Reject bad constructor arguments before anything is started."""

    def fail(argument: str, value: object, expected: str, fix: str) -> ConfigurationError:
        return ConfigurationError(
            f"WandbLogger expected {argument} to be {expected}, received {describe(value)}. {fix}"
        )

    for argument, value in (("save_dir", save_dir), ("dir", dir)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise fail(argument, value, "a str or os.PathLike", "Pass a folder, e.g. 'logs'.")
    if run_id is not None and (not isinstance(run_id, str) or not run_id):
        raise fail("id (or version)", run_id, "a non-empty str or None", "Pass e.g. id='abc123'.")
    if log_model not in (True, False, "all"):
        raise fail("log_model", log_model, "True, False or 'all'", "Pass e.g. log_model='all'.")
    if not isinstance(prefix, str):
        raise fail("prefix", prefix, "a str", "Pass e.g. prefix='train'.")


def _to_value(value: Any) -> Any:
    """One-element tensors as floats (wandb would store a tensor as a histogram); the rest as is."""
    if hasattr(value, "numel") and value.numel() == 1:
        return float(value)
    return value
