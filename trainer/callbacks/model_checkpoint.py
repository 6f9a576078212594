"""ModelCheckpoint and OnExceptionCheckpoint: when to save, what to keep, what is best.

The Trainer writes the files (``trainer.save_checkpoint``, atomic, see ``trainer/checkpoint``);
this callback decides when, names the directory from a template, keeps the ``save_top_k`` best by
``monitor`` and deletes a checkpoint only after its replacement is complete. ``save_last``
maintains a ``last`` symlink to the newest checkpoint, replaced atomically.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelCheckpoint", "OnExceptionCheckpoint"]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


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
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") != self.dirpath:
            return  # another directory: its files are not ours to rank or delete
        self.best_model_path = state_dict.get("best_model_path", "")
        score = state_dict.get("best_model_score")
        self.best_model_score = None if score is None else torch.tensor(score)
        self.best_k_models = {
            p: s for p, s in state_dict.get("best_k_models", {}).items() if os.path.isdir(p)
        }
        self.last_model_path = state_dict.get("last_model_path", "")
        self._saved = [p for p in state_dict.get("saved", []) if os.path.isdir(p)]

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
        """Save now (if not already at this step), rank by ``monitor``, prune, update ``last``."""
        step = trainer.global_step
        if step == self._last_saved_step:
            return
        metrics = trainer.callback_metrics
        score = self._score(metrics)
        path = os.path.join(self.dirpath, self.format_name(trainer.current_epoch, step, metrics))
        written, dropped = "", []
        if self._is_top_k(score):
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
            written = path
            dropped = self._record(path, score)
        if self.save_last:
            if not written:
                written = os.path.join(self.dirpath, f"last-{os.path.basename(path)}")
                trainer.save_checkpoint(written, weights_only=self.save_weights_only)
            if trainer.is_global_zero:
                self._point_last_at(written)
            else:
                self.last_model_path = written
        if trainer.is_global_zero:
            for old in dropped:  # only now: the new checkpoint and the `last` link are in place
                self._delete(old)
            if written:
                for (
                    logger
                ) in trainer.loggers:  # artifact upload (WandbLogger/MLFlowLogger log_model)
                    logger.after_save_checkpoint(self)
        self._last_saved_step = step
        if written and self.verbose and trainer.is_global_zero:
            print(f"ModelCheckpoint: saved {written}")

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
        if path != self.last_model_path and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)

    def _point_last_at(self, target: str) -> None:
        """Replace the ``last`` symlink atomically, then drop an older ``last-*`` directory."""
        link = Path(self.dirpath) / "last"
        temporary = Path(self.dirpath) / f".last.tmp-{uuid.uuid4().hex[:8]}"
        os.symlink(os.path.basename(target), temporary)
        os.replace(temporary, link)
        previous, self.last_model_path = self.last_model_path, target
        if previous and os.path.basename(previous).startswith("last-") and previous != target:
            shutil.rmtree(previous, ignore_errors=True)

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
