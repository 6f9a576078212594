"""When ModelCheckpoint saves: its trigger arguments, checked, and Lightning 2.6's timing rules.

This module owns checking ModelCheckpoint's constructor arguments as Lightning does (``mode``,
``save_top_k``, the three mutually exclusive triggers, top-k without a monitor), resolving the
triggers (``every_n_epochs=1`` when none is given), and `CheckpointSchedule`, the hooks that
decide when to save: after a batch (steps, time), at the end of the training epoch or after
validation (``save_on_train_epoch_end``), waiting for validation when the monitored metric is not
there yet, and ``last`` at the end of training. It does not save, rank or delete anything
(``model_checkpoint.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Checkpoint
from trainer.callbacks.checkpoint_naming import monitor_candidates
from trainer.errors import ConfigurationError, describe
from trainer.trainer.durations import val_check_seconds

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = [
    "CheckpointSchedule",
    "Triggers",
    "resolve_triggers",
    "should_save_on_train_epoch_end",
    "trigger_state_key",
    "validates_after",
]


@dataclass(frozen=True)
class Triggers:
    """The resolved triggers: 0 or None means off."""

    every_n_train_steps: int
    every_n_epochs: int
    train_time_interval: float | None  # seconds


def trigger_state_key(checkpoint: Any, train_time_interval: Any) -> str:
    """Lightning's ``ModelCheckpoint.state_key``: the monitor, the mode and the resolved
    triggers (``train_time_interval`` as given), so two checkpointers keep two states."""
    fields = {
        "monitor": checkpoint.monitor,
        "mode": checkpoint.mode,
        "every_n_train_steps": checkpoint.every_n_train_steps,
        "every_n_epochs": checkpoint.every_n_epochs,
        "train_time_interval": train_time_interval,
    }
    return f"{type(checkpoint).__qualname__}{fields!r}"


def resolve_triggers(
    *,
    monitor: str | None,
    mode: str,
    save_top_k: int,
    every_n_train_steps: int | None,
    every_n_epochs: int | None,
    train_time_interval: Any,
) -> Triggers:
    """Check the arguments as Lightning's ModelCheckpoint does; ``every_n_epochs=1`` when no
    trigger is given.

    Raises:
        ConfigurationError: ``mode`` is not "min"/"max"; ``save_top_k`` < -1; a trigger is
            negative; more than one trigger is on; or ``save_top_k`` > 1 with no ``monitor``.
    """
    if mode not in ("min", "max"):
        raise ConfigurationError(f"ModelCheckpoint(mode={mode!r}): expected 'min' or 'max'.")
    if not isinstance(save_top_k, int) or isinstance(save_top_k, bool) or save_top_k < -1:
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
    seconds = _seconds(train_time_interval)
    if every_n_train_steps is None and every_n_epochs is None and seconds is None:
        triggers = Triggers(0, 1, None)
    else:
        triggers = Triggers(every_n_train_steps or 0, every_n_epochs or 0, seconds)
    is_on = [triggers.every_n_train_steps >= 1, triggers.every_n_epochs >= 1, seconds is not None]
    if sum(is_on) > 1:
        raise ConfigurationError(
            f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs="
            f"{every_n_epochs}, train_time_interval={train_time_interval}): the three triggers "
            "are mutually exclusive. Set only one of them; use a second ModelCheckpoint for "
            "another schedule."
        )
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise ConfigurationError(
            f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None): with no quantity to rank "
            "by only -1 (keep all), 0 or 1 (keep the newest) are valid. Set monitor=... to keep "
            f"the {save_top_k} best, or monitor='step', mode='max' to keep the {save_top_k} newest."
        )
    return triggers


class CheckpointSchedule(Checkpoint):
    """The hooks that decide when ModelCheckpoint saves (Lightning 2.6's timing).

    ``_save(trainer, with_top_k=...)`` is ModelCheckpoint's: it ranks and writes. The rules:
    a step or time trigger saves after the batch (only on a batch that steps the optimizer),
    unless the monitored metric is missing or a validation follows this last batch: then it
    saves after that validation. The epoch trigger saves at the end of the training epoch or
    after each validation (`should_save_on_train_epoch_end`). Nothing is saved outside fit, in
    the sanity check, with ``fast_dev_run``, or twice at one step.
    """

    dirpath: str | None
    monitor: str | None
    save_last: Any
    every_n_train_steps: int
    every_n_epochs: int
    train_time_interval: float | None
    save_on_train_epoch_end: bool | None
    _last_saved_step: int
    _last_time: float | None
    _defer_save_until_validation: bool
    _has_validated: bool

    def _save(self, trainer: Trainer, *, with_top_k: bool = True) -> None:
        raise NotImplementedError

    def _now(self) -> float:
        """The clock ``train_time_interval`` is measured on (``time.monotonic``)."""
        raise NotImplementedError

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")
        if stage == "fit":
            self._has_validated = False

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._last_time = self._now()

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every_n = self.every_n_train_steps
        is_step_due = every_n >= 1 and trainer.global_step % every_n == 0
        if not module.automatic_optimization:  # Lightning: steps only, no deferral to validation
            if is_step_due and not self._should_skip(trainer) and self._has_monitor(trainer):
                self._save(trainer)
            return
        if not trainer.accelerator.sync_gradients:
            return  # never inside an accumulation window: a resume could not continue it
        is_time_due = False
        if self.train_time_interval is not None:
            now = self._now()
            elapsed = now - (self._last_time if self._last_time is not None else now)
            # one decision for every process, or the others would wait in a collective save
            is_time_due = trainer.strategy.broadcast(elapsed >= self.train_time_interval)
            if is_time_due:
                self._last_time = now
        if not (is_step_due or is_time_due) or not self._has_monitor(trainer):
            return
        if (
            self.monitor is not None
            and not should_save_on_train_epoch_end(trainer, self.save_on_train_epoch_end)
            and validates_after(trainer, batch_idx)
        ):
            self._defer_save_until_validation = True  # save with this validation's metrics
            return
        if not self._should_skip(trainer):
            self._save(trainer)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.state.stage == "fit":
            self._has_validated = True
        if self._should_skip(trainer) or should_save_on_train_epoch_end(
            trainer, self.save_on_train_epoch_end
        ):
            return
        if self._defer_save_until_validation:
            self._defer_save_until_validation = False
            self._save(trainer)
        elif self._is_epoch_due(trainer):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if (
            not self._should_skip(trainer)
            and should_save_on_train_epoch_end(trainer, self.save_on_train_epoch_end)
            and self._is_epoch_due(trainer)
        ):
            self._save(trainer)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        # `last` holds the final state too (e.g. stopped by max_steps between save points).
        if self.save_last and not trainer.fast_dev_run:
            if trainer.global_step != self._last_saved_step:
                self._save(trainer, with_top_k=False)

    def _should_skip(self, trainer: Trainer) -> bool:
        """Lightning's: never in fast_dev_run, outside fit, in the sanity check, or twice at a step."""
        return (
            bool(trainer.fast_dev_run)
            or trainer.state.stage != "fit"
            or trainer.sanity_checking
            or trainer.global_step == self._last_saved_step
        )

    def _has_monitor(self, trainer: Trainer) -> bool:
        """Whether a step save can rank now; if not, it waits for the next validation."""
        if self.monitor is None or self.monitor in monitor_candidates(trainer):
            return True
        self._defer_save_until_validation = True
        return False

    def _is_epoch_due(self, trainer: Trainer) -> bool:
        every_n = self.every_n_epochs
        return every_n >= 1 and (trainer.current_epoch + 1) % every_n == 0


def should_save_on_train_epoch_end(trainer: Trainer, setting: bool | None) -> bool:
    """Lightning's rule for ``save_on_train_epoch_end=None``: at the end of the training epoch
    (after validation and the module's ``on_train_epoch_end``) when validation runs once at
    every epoch's end or not at all; after each validation otherwise."""
    if setting is not None:
        return setting
    if val_check_seconds(trainer) is not None:
        return False  # time-based validation: save after each one (Lightning)
    if trainer.check_val_every_n_epoch != 1:
        return False  # which epochs validate is not known here: save after validation
    if _val_batches(trainer) == 0:
        return True
    return trainer.val_check_interval == 1.0


def validates_after(trainer: Trainer, batch_idx: int) -> bool:
    """Whether batch ``batch_idx`` is the epoch's last and a validation follows it."""
    total = trainer.num_training_batches
    if not math.isfinite(total) or batch_idx + 1 != int(total) or _val_batches(trainer) == 0:
        return False
    if val_check_seconds(trainer) is not None:
        return False  # validation follows the clock, not the epoch's last batch
    every = trainer.check_val_every_n_epoch
    return every is None or (trainer.current_epoch + 1) % every == 0


def _val_batches(trainer: Trainer) -> float:
    """``num_val_batches``: one count, or one per dataloader."""
    batches = trainer.num_val_batches
    return sum(batches) if isinstance(batches, list | tuple) else batches


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise ConfigurationError(
        f"ModelCheckpoint(train_time_interval={describe(value)}): expected a timedelta or seconds."
    )
