"""ModelCheckpoint: when to save, what to keep, what is best (OnExceptionCheckpoint, re-exported
here, is in ``on_exception_checkpoint.py``).

The Trainer writes the files (``trainer.save_checkpoint``, atomic, see ``trainer/checkpoint``);
this callback decides when (Lightning 2.6's rules, ``checkpoint_triggers.py``), names the
directory from a template with ``-v1``, ``-v2`` on a collision (``checkpoint_naming.py``), keeps
the ``save_top_k`` best by ``monitor`` and deletes a checkpoint only after its replacement is
complete. ``save_last`` keeps a real checkpoint directory ``last`` (no symbolic link: it survives
copies), swapped in atomically. The state it restores on resume is checked: only checkpoint
folders inside ``dirpath`` are ever tracked, so only those are ever deleted. Those checks
(restored state, deletion, replacing ``last``) live in ``checkpoint_folder.py``; confinement
itself in ``trainer/checkpoint/paths``.
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from trainer.callbacks.checkpoint_folder import (
    adopt_path,
    checked_state,
    delete_checkpoint,
    local_dirpath,
    write_best_k_yaml,
    write_last,
)
from trainer.callbacks.checkpoint_naming import (
    fill_template,
    first_free_name,
    is_taken_last,
    monitor_candidates,
)
from trainer.callbacks.checkpoint_triggers import (
    CheckpointSchedule,
    resolve_triggers,
    trigger_state_key,
)
from trainer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from trainer.checkpoint.atomic import remove_stale_temporaries
from trainer.errors import ConfigurationError, TrainerError, describe

if TYPE_CHECKING:
    from trainer.plugins import PendingSave
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["ModelCheckpoint", "OnExceptionCheckpoint"]

LAST_NAME = "last"  # the real checkpoint directory save_last keeps (Lightning: last.ckpt)
_BOOKKEEPING = ("best_k_models", "best_model_path", "best_model_score", "last_model_path")
_BOOKKEEPING += ("kth_best_model_path", "kth_value", "current_score", "_saved", "_last_saved_step")


class ModelCheckpoint(CheckpointSchedule):
    """Save checkpoints during fit (Lightning 2.6's arguments, attributes and timing).

    Args:
        dirpath: directory of the checkpoints; default ``<default_root_dir>/checkpoints``.
        filename: name template with ``{epoch}``, ``{step}`` and metric fields, e.g.
            ``"{epoch}-{val/loss:.3f}"``; a bare ``{name}`` becomes ``name=value``
            (``auto_insert_metric_name``); "/" in a name becomes "_". Default
            ``"{epoch}-{step}"`` (``epoch=2-step=300``).
        monitor: the metric to rank checkpoints by (``"epoch"`` and ``"step"`` work too);
            None keeps the newest.
        verbose: print a line for each checkpoint ranked (Lightning's messages).
        save_last: also keep ``last``, the newest state (written at every save point, and at
            the end of training if that step was not saved). ``"link"`` is accepted and writes
            a real copy too (no symbolic links, see docs/migration/lightning.md).
        save_top_k: how many to keep (-1 all, 0 none but ``last``; above 1 needs ``monitor``).
        save_on_exception: save a checkpoint (and ``last``) when fit raises.
        save_weights_only: only the model weights (no optimizer or loop state).
        mode: "min" or "max".
        auto_insert_metric_name: write ``name=`` before each bare template field.
        every_n_train_steps: save every N optimizer steps.
        train_time_interval: save every time this interval has passed (a ``timedelta``).
        every_n_epochs: save every N epochs (the default when no trigger is set, with N=1).
        save_on_train_epoch_end: save the epoch's checkpoint at the end of the training epoch
            (True) or after validation (False). None: at the training epoch end when validation
            runs once at the end of every epoch or not at all, after each validation otherwise.
        enable_version_counter: a taken name gets ``-v1``, ``-v2``, ... (False: replace it).

    Attributes:
        best_model_path: the best checkpoint so far (by ``monitor``), as Lightning's.
        best_model_score: its score.
        best_k_models: path -> score (a 0-dim tensor, as Lightning's) of the kept top k.
        kth_best_model_path: the worst of the kept top-k.
        kth_value: its score.
        current_score: the monitored value at the last save.
        last_model_path: the newest ``last`` checkpoint.

    Raises:
        ConfigurationError: an argument is invalid; the three triggers are combined; or
            ``save_top_k`` > 1 with no ``monitor``.

    Examples:
        >>> ModelCheckpoint(monitor="val/loss", mode="min", save_top_k=2, save_last=True)
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = LAST_NAME
    FILE_EXTENSION = ""  # checkpoints are directories (Lightning: ".ckpt" files)
    STARTING_VERSION = 1

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: Any = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        triggers = resolve_triggers(
            monitor=monitor,
            mode=mode,
            save_top_k=save_top_k,
            every_n_train_steps=every_n_train_steps,
            every_n_epochs=every_n_epochs,
            train_time_interval=train_time_interval,
        )
        if save_last not in (None, True, False, "link"):
            raise ConfigurationError(
                f"ModelCheckpoint(save_last={describe(save_last)}): expected None, True, False or 'link'."
            )
        self.dirpath = local_dirpath(dirpath)
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = triggers.every_n_train_steps
        self.every_n_epochs = triggers.every_n_epochs
        self.train_time_interval = triggers.train_time_interval
        self._interval_given = train_time_interval  # its repr is part of `state_key`
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = enable_version_counter
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.kth_best_model_path = ""
        self.kth_value = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.current_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._saved: list[str] = []  # checkpoints in save order (for monitor=None)
        self._last_saved_step = 0  # Lightning: nothing to save before the first step
        self._last_time: float | None = None
        self._defer_save_until_validation = False  # a step save waits for the monitored metric
        self._has_validated = False  # a validation ran in this fit: a missing monitor is an error
        self._has_warned_missing = False
        self._pending: PendingSave | None = None  # a background save not yet complete

    @property
    def state_key(self) -> str:
        return trigger_state_key(self, self._interval_given)

    @property
    def legacy_state_key(self) -> str:
        """The key of checkpoints written before the triggers joined `state_key`."""
        return f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {
            "dirpath": self.dirpath,
            "monitor": self.monitor,
            "best_model_path": self.best_model_path,
            "best_model_score": _float_or_none(self.best_model_score),
            "current_score": _float_or_none(self.current_score),
            "best_k_models": {path: float(score) for path, score in self.best_k_models.items()},
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": float(self.kth_value),
            "last_model_path": self.last_model_path,
            "saved": list(self._saved),
            "last_saved_step": self._last_saved_step,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the bookkeeping of a resumed run, trusting none of it.

        Every path must lie inside the saved ``dirpath``; it is looked up by its name in this
        callback's ``dirpath`` (so a copied or moved run keeps its ranking) through
        `resolve_inside` (no ``..``, no symbolic link). Paths whose folder is gone are dropped;
        a folder there that is not a checkpoint (no manifest) is dropped with a warning.

        Raises:
            CheckpointError: a field has the wrong type, or a path leaves ``dirpath`` or goes
                through a symbolic link; the message names the field and the value.
        """
        state = checked_state(state_dict, self.state_key)
        saved_dirpath = state.get("dirpath") or self.dirpath
        dirpath = self.dirpath
        if dirpath is None or saved_dirpath is None:
            return  # no folder to confine to: nothing of it is ours to rank or delete
        source = f"ModelCheckpoint state ({self.state_key})"

        def adopt(field: str, path: str) -> str:
            return adopt_path(
                field, path, saved_dirpath=saved_dirpath, dirpath=dirpath, source=source
            )

        self.best_k_models = {
            kept: torch.tensor(float(score))
            for path, score in state.get("best_k_models", {}).items()
            if (kept := adopt("best_k_models", path))
        }
        self._saved = [kept for path in state.get("saved", []) if (kept := adopt("saved", path))]
        self.best_model_path = adopt("best_model_path", state.get("best_model_path", ""))
        self.kth_best_model_path = adopt(
            "kth_best_model_path", state.get("kth_best_model_path", "")
        )
        for field in ("best_model_score", "current_score"):
            score = state.get(field)
            setattr(self, field, None if score is None else torch.tensor(score))
        if "kth_value" in state:
            self.kth_value = torch.tensor(float(state["kth_value"]))
        self.last_model_path = adopt("last_model_path", state.get("last_model_path", ""))
        self._last_saved_step = state.get("last_saved_step", self._last_saved_step)

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        if not self.save_on_exception or trainer.state.stage != "fit" or not trainer.optimizers:
            return
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        if trainer.global_step == self._last_saved_step:
            return
        try:
            path = self.format_checkpoint_name(monitor_candidates(trainer))
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
            self._save(trainer, with_top_k=False)  # `last`, if save_last
            self._last_saved_step = trainer.global_step
        except (OSError, TrainerError) as err:  # the exception being raised matters more
            warnings.warn(f"ModelCheckpoint(save_on_exception=True): {err}", stacklevel=2)
            return
        if trainer.is_global_zero:
            print(
                f"An {type(exception).__name__} was raised with message: {exception}, "
                f"saved checkpoint to {path}"
            )

    def _now(self) -> float:
        return time.monotonic()

    # ---- what ---------------------------------------------------------------------------------
    def save(self, trainer: Trainer) -> None:
        """Save now (if not already at this step), rank by ``monitor``, prune, update ``last``."""
        self._save(trainer)

    def _save(self, trainer: Trainer, *, with_top_k: bool = True) -> None:
        """Rank and write the top-k checkpoint (``with_top_k``) and ``last``; prune.

        The bookkeeping is updated before writing, so each checkpoint's saved state already
        counts it (as Lightning's does): a run resumed from it keeps exactly ``save_top_k``.
        With background saves (``trainer.plugins.AsyncCheckpointIO``) everything that says the
        new checkpoint exists (``best_model_path`` and the other attributes, deleting those it
        pushed out of the top k, swapping in ``last``) happens only once it is complete.
        """
        step = trainer.global_step
        if step == self._last_saved_step:
            return
        self._complete_pending_save()  # this save ranks against the previous one's bookkeeping
        if trainer.is_global_zero:  # what a killed save left behind
            remove_stale_temporaries(self.dirpath)
        metrics = monitor_candidates(trainer)
        before = {name: copy.copy(getattr(self, name)) for name in _BOOKKEEPING}
        path, dropped = (self._rank(trainer, metrics) if with_top_k else None) or ("", [])
        if not path and not self.save_last:
            return
        previous_last = self.last_model_path
        self._last_saved_step = step
        if self.save_last:  # before both writes: the two copies hold the same state
            self.last_model_path = self._free_path(
                trainer, metrics, self.CHECKPOINT_NAME_LAST, reusable=previous_last, is_last=True
            )
        try:
            pending = (
                trainer.save_checkpoint(path, weights_only=self.save_weights_only) if path else None
            )
            if self.save_last:  # a real copy, swapped in with no moment without one
                last = Path(self.last_model_path)
                pending = write_last(trainer, last, pending, weights_only=self.save_weights_only)
        except BaseException:  # track nothing that is not on disk
            self._set_bookkeeping(before)
            raise
        if previous_last and previous_last != self.last_model_path:
            dropped.append(previous_last)  # `last` moved (a versioned name, a templated name)
        saved = path or self.last_model_path

        def after_save() -> None:
            self._after_save(trainer, saved, dropped)

        if pending is None or pending.is_complete:
            after_save()
            return
        # Written in the background: until it is complete, the attributes keep describing
        # checkpoints that exist; then they take the values this save recorded.
        recorded = {name: getattr(self, name) for name in _BOOKKEEPING}
        self._set_bookkeeping({**before, "_last_saved_step": step})
        pending.then(lambda: self._set_bookkeeping(recorded))
        pending.then(after_save)
        self._pending = pending

    def _rank(self, trainer: Trainer, metrics: dict[str, Any]) -> tuple[str, list[str]] | None:
        """Register this step's checkpoint if it makes the top k: (its path, the paths it
        pushes out); None when it does not, or the monitored metric is missing."""
        if self.save_top_k == 0:
            return None
        if self.monitor is None:
            path = self._free_path(trainer, metrics, reusable=self.best_model_path)
            self.best_model_path = path
            if path not in self._saved:
                self._saved.append(path)
            dropped: list[str] = []
            while self.save_top_k != -1 and len(self._saved) > self.save_top_k:
                dropped.append(self._saved.pop(0))
            return path, dropped
        score = self._score(metrics)
        if score is None:
            return None
        if not self.check_monitor_top_k(trainer, torch.tensor(score)):
            if self.verbose and trainer.is_global_zero:
                print(
                    f"Epoch {metrics['epoch']:d}, global step {metrics['step']:d}: "
                    f"{self.monitor!r} was not in top {self.save_top_k}"
                )
            return None
        score = score if not math.isnan(score) else (math.inf if self.mode == "min" else -math.inf)
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        replaced = ""
        if len(self.best_k_models) == k:
            replaced = self._kth_path()
            del self.best_k_models[replaced]
        path = self._free_path(trainer, metrics, reusable=replaced)
        self.current_score = torch.tensor(score)
        self.best_k_models[path] = torch.tensor(score)
        if len(self.best_k_models) == k:
            worst = max if self.mode == "min" else min
            self.kth_best_model_path = worst(self.best_k_models, key=self._score_of)
            self.kth_value = self.best_k_models[self.kth_best_model_path].clone()
        pick = min if self.mode == "min" else max
        self.best_model_path = pick(self.best_k_models, key=self._score_of)
        self.best_model_score = self.best_k_models[self.best_model_path].clone()
        if self.verbose and trainer.is_global_zero:
            print(
                f"Epoch {metrics['epoch']:d}, global step {metrics['step']:d}: {self.monitor!r} "
                f"reached {score:0.5f} (best {float(self.best_model_score):0.5f}), saving model "
                f"to {path!r} as top {k}"
            )
        return path, [replaced] if replaced and replaced != path else []

    def check_monitor_top_k(self, trainer: Trainer, current: torch.Tensor | None = None) -> bool:
        """Whether ``current`` makes the top k (the same answer on every process)."""
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        kth = self._score_of(self._kth_path())
        value = float(current)
        is_better = value < kth if self.mode == "min" else value > kth
        return trainer.strategy.reduce_boolean_decision(is_better)

    def _kth_path(self) -> str:
        """The worst kept checkpoint (Lightning's ``kth_best_model_path``)."""
        if self.kth_best_model_path in self.best_k_models:
            return self.kth_best_model_path
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self._score_of)

    def _score_of(self, path: str) -> float:
        """The kept checkpoint's score as a number (the values are tensors, as in Lightning)."""
        return float(self.best_k_models[path])

    def _score(self, metrics: dict[str, Any]) -> float | None:
        """The monitored value; None (with a warning) when it is missing before any validation."""
        if self.monitor in metrics:
            return float(metrics[self.monitor])
        logged = sorted(set(metrics) - {"epoch", "step"})
        message = (
            f"ModelCheckpoint(monitor={self.monitor!r}): the metric was not logged; logged "
            f"metrics: {logged}. Log it with self.log(...) or change monitor."
        )
        if self._has_validated:
            raise ConfigurationError(message)
        if not self._has_warned_missing:  # Lightning: a warning until validation has run
            self._has_warned_missing = True
            warnings.warn(message, stacklevel=2)
        return None

    def _free_path(
        self,
        trainer: Trainer,
        metrics: dict[str, Any],
        filename: str | None = None,
        *,
        reusable: str = "",
        is_last: bool = False,
    ) -> str:
        """The path for ``metrics``; with ``enable_version_counter``, the first of ``name``,
        ``name-v1``, ... that is free or ``reusable`` (decided on process 0 for every process)."""

        def name_for(version: int | None) -> str:
            return self.format_checkpoint_name(dict(metrics), filename, ver=version)

        if not self.enable_version_counter:
            return name_for(None)
        chosen = None
        if trainer.is_global_zero:
            is_taken = is_taken_last if is_last else os.path.lexists
            chosen = first_free_name(name_for, is_taken, reusable, self.STARTING_VERSION)
        return trainer.strategy.broadcast(chosen) if trainer.world_size > 1 else chosen

    def _after_save(self, trainer: Trainer, saved: str, dropped: list[str]) -> None:
        """Once ``saved`` is complete: delete what it replaced, tell the loggers."""
        if not trainer.is_global_zero:
            return
        resumed_from = os.path.realpath(trainer.ckpt_path) if trainer.ckpt_path else None
        for old in dropped:  # only now: the new checkpoint and `last` are in place
            if os.path.realpath(old) != resumed_from:  # Lightning keeps what fit resumed from
                self._delete(old)
        if saved:  # artifact upload (WandbLogger/MLFlowLogger log_model)
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)

    def _set_bookkeeping(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    def _complete_pending_save(self) -> None:
        """Wait for this callback's background save, if any, and run what waited for it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def _delete(self, path: str) -> None:
        """Remove a checkpoint that left the top k: only a checkpoint folder inside dirpath."""
        if path not in (self.last_model_path, *self.best_k_models, *self._saved):
            delete_checkpoint(path, self.dirpath)

    def format_checkpoint_name(
        self,
        metrics: dict[str, Any],
        filename: str | None = None,
        ver: int | None = None,
        prefix: str | None = None,
    ) -> str:
        """The checkpoint path for ``metrics`` (Lightning's signature), in ``dirpath`` if set.

        Examples:
            >>> ModelCheckpoint(dirpath="ckpts", filename="{epoch}").format_checkpoint_name(
            ...     {"epoch": 2}, ver=1)
            'ckpts/epoch=2-v1'
        """
        template = filename or self.filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        name = fill_template(
            template, metrics, auto_insert_metric_name=self.auto_insert_metric_name
        )
        if prefix is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join([prefix, name])
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def file_exists(self, filepath: str | os.PathLike[str], trainer: Trainer) -> bool:
        """Whether ``filepath`` exists on process 0 (the answer every process gets, as Lightning)."""
        return bool(trainer.strategy.broadcast(os.path.exists(filepath)))

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write ``best_k_models`` (path: score) as YAML to ``filepath``, by default
        ``<dirpath>/best_k_models.yaml``, atomically (Lightning's method)."""
        write_best_k_yaml(self.best_k_models, filepath, self.dirpath)

    def format_name(self, epoch: int, step: int, metrics: dict[str, Any]) -> str:
        """The directory name (no folder) for ``epoch``, ``step`` and ``metrics``."""
        path = self.format_checkpoint_name({"epoch": epoch, "step": step, **metrics})
        return os.path.basename(path)


def _float_or_none(value: torch.Tensor | float | None) -> float | None:
    return None if value is None else float(value)
