"""Timer: measure the time spent in each stage, and stop training after a duration.

This module owns the per-stage clocks ("train", "validate", "test", "predict"), parsing the
duration, the stop decision (global rank zero's clock decides, every process follows) and the
resumable state (the training time already spent). It speaks to the Trainer only through
``trainer.should_stop``. ``Trainer(max_time=...)`` adds one (``interval="step"``), as Lightning.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.durations import parse_duration

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["Timer"]

_STAGES = ("train", "validate", "test", "predict")


class Timer(Callback):
    """Track the time spent in each stage; stop ``fit`` once ``duration`` of training is spent.

    The "train" clock runs from ``on_train_start`` to ``on_train_end`` (validation inside fit
    included, as in Lightning); "validate", "test" and "predict" from their ``on_*_start`` to
    ``on_*_end``. The check runs after each training batch (``interval="step"``) or each
    training epoch (``"epoch"``), and once when fit starts, so a run resumed with its time
    already spent stops at once. The training time is saved in checkpoints: a resumed run
    counts from where the interrupted one stopped.

    Args:
        duration: ``"DD:HH:MM:SS"`` (e.g. ``"00:12:00:00"``), a ``timedelta``, a dict of
            timedelta fields (``{"hours": 12}``), or None to measure only.
        interval: ``"step"`` or ``"epoch"``: how often to check.
        verbose: print a line when the time is up.

    Raises:
        ConfigurationError: ``duration`` or ``interval`` is invalid.

    Examples:
        >>> timer = Timer(duration="00:00:01:30", interval="step")  # 90 seconds
        >>> # Trainer(callbacks=[timer]).fit(module) stops after the first step past 90 s;
        >>> timer.time_elapsed("train")  # e.g. 90.02, and time_remaining("train") == -0.02
    """

    def __init__(
        self,
        duration: str | dt.timedelta | dict[str, int] | None = None,
        interval: str = "step",
        verbose: bool = True,
    ) -> None:
        if interval not in ("step", "epoch"):
            raise ConfigurationError(
                f"Timer(interval={describe(interval)}): expected 'step' or 'epoch'."
            )
        self._duration = _parse_duration(duration)
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._offset = 0.0  # training seconds spent before a resume

    # ---- public clock -------------------------------------------------------------------------
    @property
    def duration(self) -> float | None:
        """The training time allowed, in seconds, or None."""
        return self._duration

    def start_time(self, stage: str = "train") -> float | None:
        """``time.monotonic()`` when ``stage`` last started, or None."""
        return self._start_time[_check_stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        """``time.monotonic()`` when ``stage`` last ended, or None while running / never run."""
        return self._end_time[_check_stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in ``stage`` (for "train", including the time before a resume).

        Examples:
            >>> Timer().time_elapsed("test")  # never started
            0.0
        """
        start, end = self.start_time(stage), self.end_time(stage)
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of ``duration`` (negative once exceeded), or None without a duration."""
        if self._duration is None:
            return None
        return self._duration - self.time_elapsed(stage)

    # ---- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))

    # ---- hooks ----------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("train")

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._end("train")

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("validate")

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._end("validate")

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("test")

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._end("test")

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("predict")

    def on_predict_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._end("predict")

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        # Runs after a checkpoint's state is loaded: a resumed run may have no time left.
        self._check_time_remaining(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._interval == "step":
            self._check_time_remaining(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._interval == "epoch":
            self._check_time_remaining(trainer)

    def _start(self, stage: str) -> None:
        self._start_time[stage] = time.monotonic()
        self._end_time[stage] = None

    def _end(self, stage: str) -> None:
        self._end_time[stage] = time.monotonic()

    def _check_time_remaining(self, trainer: Trainer) -> None:
        if self._duration is None:
            return
        is_up = self.time_elapsed("train") >= self._duration
        if trainer.world_size > 1:
            is_up = bool(trainer.strategy.broadcast(is_up, 0))  # clocks differ: rank 0 decides
        if is_up and not trainer.should_stop:
            trainer.should_stop = True
            if self._verbose and trainer.is_global_zero:
                elapsed = dt.timedelta(seconds=int(self.time_elapsed("train")))
                print(f"Timer: time limit reached after {elapsed}. Stopping training.")


def _parse_duration(value: object) -> float | None:
    """Seconds from "DD:HH:MM:SS", a timedelta, a dict of timedelta fields, or None."""
    return None if value is None else parse_duration("Timer(duration", value).total_seconds()


def _check_stage(stage: str) -> str:
    if stage not in _STAGES:
        raise ConfigurationError(
            f"Timer: stage={describe(stage)} is not one of {list(_STAGES)}. Pass e.g. 'train'."
        )
    return stage
