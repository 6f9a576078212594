"""ModelCheckpoint and OnExceptionCheckpoint: when to save, what to keep, what is best.

The Trainer writes the files (``trainer.save_checkpoint``, atomic, see ``trainer/checkpoint``);
this callback decides when, names the directory from a template, keeps the ``save_top_k`` best by
``monitor`` and deletes a checkpoint only after its replacement is complete. ``save_last`` keeps a
real checkpoint directory ``last`` (no symbolic link: it survives copies), swapped in atomically.
The state it restores on resume is checked: only checkpoint folders inside ``dirpath`` are ever
tracked, so only those are ever deleted. Those checks (restored state, deletion, replacing
``last``) live in ``trainer/callbacks/checkpoint_folder.py``; confinement itself in
``trainer/checkpoint/paths``.
"""

from __future__ import annotations

import copy
import math
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.callbacks.checkpoint_folder import (
    adopt_path,
    checked_state,
    delete_checkpoint,
    refusal_for_last,
    swap_in_last,
)
from trainer.checkpoint.atomic import process_tag, remove_stale_temporaries
from trainer.errors import CheckpointError, ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.plugins import PendingSave
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["ModelCheckpoint", "OnExceptionCheckpoint"]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")
LAST_NAME = "last"  # the real checkpoint directory save_last keeps (Lightning: last.ckpt)
_BOOKKEEPING = ("best_k_models", "best_model_path", "best_model_score", "last_model_path")
_BOOKKEEPING += ("_saved", "_last_saved_step")


class ModelCheckpoint(Callback):
    """Save checkpoints during fit (Lightning's arguments and semantics).

    Args:
        dirpath: directory of the checkpoints; default ``<default_root_dir>/checkpoints``.
        filename: name template with ``{epoch}``, ``{step}`` and metric fields, e.g.
            ``"epoch={epoch}-step={step}-{val/loss:.3f}"``; a bare ``{name}`` becomes
            ``name=value`` (``auto_insert_metric_name``); "/" in a name becomes "_".
        monitor: the metric to rank checkpoints by (None: the latest are kept).
        mode: "min" or "max".
        save_top_k: how many to keep (-1 all, 0 none but ``last``).
        save_last: keep a ``last`` link to the newest checkpoint (written even when not top-k).
        every_n_train_steps: save every N optimizer steps.
        every_n_epochs: save every N epochs (the default, N=1, saves at the end of every
            epoch, after its validation).
        train_time_interval: save every time this interval has passed (a ``timedelta``).
        save_weights_only: only the model weights (no optimizer or loop state).

    Examples:
        >>> ModelCheckpoint(monitor="val/loss", mode="min", save_top_k=2, save_last=True)
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool | None = None,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
        train_time_interval: Any = None,
        save_weights_only: bool = False,
        auto_insert_metric_name: bool = True,
        verbose: bool = False,
    ) -> None:
        if mode not in ("min", "max"):
            raise ConfigurationError(f"ModelCheckpoint(mode={mode!r}): expected 'min' or 'max'.")
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise ConfigurationError(
                f"ModelCheckpoint(save_top_k={describe(save_top_k)}): expected an int >= -1."
            )
        for name, value in (
            ("every_n_train_steps", every_n_train_steps),
            ("every_n_epochs", every_n_epochs),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigurationError(
                    f"ModelCheckpoint({name}={describe(value)}): expected an int >= 0 or None."
                )
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps or None
        self.train_time_interval = _seconds(train_time_interval)
        is_step_based = self.every_n_train_steps is not None or self.train_time_interval is not None
        self.every_n_epochs = (
            every_n_epochs if every_n_epochs is not None else (None if is_step_based else 1)
        )
        self.save_weights_only = save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.verbose = verbose
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._saved: list[str] = []  # checkpoints in save order (for monitor=None top-k)
        self._last_saved_step = -1
        self._last_time = time.monotonic()
        self._has_validated = False
        self._pending: PendingSave | None = None  # a background save not yet complete

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {
            "dirpath": self.dirpath,
            "monitor": self.monitor,
            "best_model_path": self.best_model_path,
            "best_model_score": None
            if self.best_model_score is None
            else float(self.best_model_score),
            "best_k_models": dict(self.best_k_models),
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
            kept: score
            for path, score in state.get("best_k_models", {}).items()
            if (kept := adopt("best_k_models", path))
        }
        self._saved = [kept for path in state.get("saved", []) if (kept := adopt("saved", path))]
        self.best_model_path = adopt("best_model_path", state.get("best_model_path", ""))
        score = state.get("best_model_score")
        self.best_model_score = None if score is None else torch.tensor(score)
        self.last_model_path = adopt("last_model_path", state.get("last_model_path", ""))
        self._last_saved_step = state.get("last_saved_step", -1)

    # ---- when ---------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._last_time = time.monotonic()

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        is_due = self.every_n_train_steps is not None and step % self.every_n_train_steps == 0
        if (
            self.train_time_interval is not None
            and time.monotonic() - self._last_time >= self.train_time_interval
        ):
            is_due = True
        if is_due and trainer.accelerator.sync_gradients:
            self._last_time = time.monotonic()
            self.save(trainer)

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._has_validated = False

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.sanity_checking or trainer.state.stage != "fit":
            return
        self._has_validated = True
        if self._is_epoch_due(trainer):
            self.save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        # Without a validation this epoch, save at its end (metrics: the training ones).
        if not self._has_validated and self._is_epoch_due(trainer):
            self.save(trainer)

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        # The state at the end of fit (e.g. stopped by max_steps mid-epoch) is resumable too.
        if self.save_last and trainer.global_step != self._last_saved_step:
            self.save(trainer)

    def _is_epoch_due(self, trainer: Trainer) -> bool:
        return bool(self.every_n_epochs) and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    # ---- what ---------------------------------------------------------------------------------
    def save(self, trainer: Trainer) -> None:
        """Save now (if not already at this step), rank by ``monitor``, prune, update ``last``.

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
        metrics = trainer.callback_metrics
        score = self._score(metrics)
        path = os.path.join(self.dirpath, self.format_name(trainer.current_epoch, step, metrics))
        before = {name: copy.copy(getattr(self, name)) for name in _BOOKKEEPING}
        is_top_k = self._is_top_k(score)
        dropped = self._record(path, score) if is_top_k else []
        previous_last = self.last_model_path
        self._last_saved_step = step
        if self.save_last:  # before both writes: the two copies hold the same state
            self.last_model_path = os.path.join(self.dirpath, LAST_NAME)
        try:
            pending = (
                trainer.save_checkpoint(path, weights_only=self.save_weights_only)
                if is_top_k
                else None
            )
            if self.save_last:
                pending = self._save_last(trainer, pending)
        except BaseException:  # track nothing that is not on disk
            self._set_bookkeeping(before)
            raise
        if previous_last != self.last_model_path and os.path.basename(previous_last).startswith(
            f"{LAST_NAME}-"
        ):
            dropped.append(previous_last)  # a `last-<name>` copy from an earlier version
        saved = path if is_top_k else self.last_model_path if self.save_last else ""

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

    def _after_save(self, trainer: Trainer, saved: str, dropped: list[str]) -> None:
        """Once ``saved`` is complete: delete what it replaced, tell the loggers, say so."""
        if not trainer.is_global_zero:
            return
        for old in dropped:  # only now: the new checkpoint and `last` are in place
            self._delete(old)
        if saved:  # artifact upload (WandbLogger/MLFlowLogger log_model)
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)
            if self.verbose:
                print(f"ModelCheckpoint: saved {saved}")

    def _set_bookkeeping(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    def _complete_pending_save(self) -> None:
        """Wait for this callback's background save, if any, and run what waited for it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def _score(self, metrics: dict[str, torch.Tensor]) -> float | None:
        if self.monitor is None:
            return None
        if self.monitor not in metrics:
            raise ConfigurationError(
                f"ModelCheckpoint(monitor={self.monitor!r}): the metric was not logged; logged metrics: {sorted(metrics)}. "
                "Log it with self.log(...) or change monitor."
            )
        value = float(metrics[self.monitor])
        return value if not math.isnan(value) else (math.inf if self.mode == "min" else -math.inf)

    def _is_top_k(self, score: float | None) -> bool:
        if self.save_top_k == 0:
            return False
        if self.save_top_k == -1 or score is None or len(self.best_k_models) < self.save_top_k:
            return True
        worst = self._worst()
        return (
            score < self.best_k_models[worst]
            if self.mode == "min"
            else score > self.best_k_models[worst]
        )

    def _worst(self) -> str:
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self.best_k_models.__getitem__)

    def _record(self, path: str, score: float | None) -> list[str]:
        """Register a complete checkpoint; return those that fell out of the top k."""
        dropped: list[str] = []
        if score is None:
            self._saved.append(path)
            self.best_model_path = path
            while self.save_top_k != -1 and len(self._saved) > self.save_top_k:
                dropped.append(self._saved.pop(0))
            return dropped
        self.best_k_models[path] = score
        if self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
            worst = self._worst()
            del self.best_k_models[worst]
            dropped.append(worst)
        pick = min if self.mode == "min" else max
        self.best_model_path = pick(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = torch.tensor(self.best_k_models[self.best_model_path])
        return dropped

    def _delete(self, path: str) -> None:
        """Remove a checkpoint that left the top k: only a checkpoint folder inside dirpath."""
        if path not in (self.last_model_path, *self.best_k_models, *self._saved):
            delete_checkpoint(path, self.dirpath)

    def _save_last(self, trainer: Trainer, pending: PendingSave | None) -> PendingSave | None:
        """Write the checkpoint again as ``dirpath/last``, swapped in with no moment without it.

        Every process writes (a sharded save is collective) to a temporary name that process 0
        chooses; process 0 then exchanges it with the existing ``last`` of any kind (an old
        symbolic link, a folder, a small file) and removes what it replaced. A background save
        (``pending``) writes its snapshot there too, and the swap waits until both are complete.
        """
        final = Path(self.dirpath) / LAST_NAME
        name, refusal = trainer.strategy.broadcast(
            (f".{LAST_NAME}.tmp-{process_tag()}", refusal_for_last(final))
            if trainer.is_global_zero
            else None
        )
        if refusal is not None:
            raise CheckpointError(refusal)
        staged = final.parent / name
        if pending is not None:
            pending.also_write(staged)
        else:
            pending = trainer.save_checkpoint(staged, weights_only=self.save_weights_only)

        def swap() -> None:
            if trainer.is_global_zero:  # the others wrote their part; process 0 exchanges
                swap_in_last(staged, final)

        if pending is None:
            swap()
            trainer.strategy.barrier()
            return None
        pending.then(swap)
        return pending

    def format_name(self, epoch: int, step: int, metrics: dict[str, Any]) -> str:
        """The directory name for ``epoch``, ``step`` and ``metrics`` from the template."""
        template = self.filename or "epoch={epoch}-step={step}"
        values = {"epoch": epoch, "step": step, **{k: float(v) for k, v in metrics.items()}}

        def fill(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2) or ""
            if name not in values:
                raise ConfigurationError(
                    f"ModelCheckpoint(filename={template!r}): {{{name}}} is neither epoch, step nor a logged metric ({sorted(values)})."
                )
            text = format(values[name], spec[1:]) if spec else str(values[name])
            prefix = match.string[max(0, match.start() - len(name) - 1) : match.start()]
            is_named = prefix == f"{name}="
            return f"{name}={text}" if self.auto_insert_metric_name and not is_named else text

        return _FIELD.sub(fill, template).replace("/", "_")


class OnExceptionCheckpoint(Callback):
    """Save a checkpoint when fit raises, to ``dirpath/filename``.

    Examples:
        >>> OnExceptionCheckpoint(dirpath="checkpoints", filename="on_exception")
    """

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        self.dirpath = os.fspath(dirpath)
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dirpath, self.filename)

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        if trainer.state.stage == "fit" and trainer.optimizers:
            trainer.save_checkpoint(self.ckpt_path)


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    if isinstance(value, int | float) and value > 0:
        return float(value)
    raise ConfigurationError(
        f"ModelCheckpoint(train_time_interval={describe(value)}): expected a timedelta or seconds."
    )
