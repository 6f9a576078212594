"""EarlyStopping: stop ``fit`` when a monitored metric stops improving.

This module owns the stopping rule (patience, ``min_delta``, thresholds, non-finite values), the
choice of when to check, and the callback's resumable state (``wait_count``, ``best_score``,
``stopped_epoch``, ``patience``, ``stopping_reason`` and its message). It reads
``trainer.callback_metrics`` and speaks back only through ``trainer.should_stop``; it does not
log metrics or save checkpoints.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import CheckpointError, ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["EarlyStopping", "EarlyStoppingReason", "MonitorNotLoggedError"]


class EarlyStoppingReason(enum.Enum):
    """Why `EarlyStopping` stopped training (``EarlyStopping.stopping_reason``); the values are
    Lightning's, and are what a checkpoint holds."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class MonitorNotLoggedError(ConfigurationError, RuntimeError):
    """``EarlyStopping(strict=True)`` found no logged value for its ``monitor`` (Lightning
    raises ``RuntimeError`` there: this is one)."""


# What checkpoints written before the values became Lightning's hold.
_OLD_REASON_NAMES = {reason.name.lower(): reason for reason in EarlyStoppingReason}


class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved for ``patience`` checks.

    A check reads ``trainer.callback_metrics[monitor]``. It is an improvement when the value
    beats the best so far by more than ``min_delta`` (lower for ``mode="min"``, higher for
    ``"max"``; a negative ``min_delta`` lets a value up to that much worse count as one, and
    become the best, as in Lightning); otherwise ``wait_count`` grows, and at ``patience`` the
    callback sets
    ``trainer.should_stop``. It stops at once when the value is NaN/inf (``check_finite``),
    reaches ``stopping_threshold``, or crosses ``divergence_threshold``.

    When it checks (Lightning's rule): with ``check_on_train_epoch_end=None``, at the end of
    each training epoch (after that epoch's validation) when validation runs once per epoch
    or not at all, and at the end of each validation otherwise (``val_check_interval`` < 1.0 or
    ``check_val_every_n_epoch`` > 1). True/False force one or the other. Sanity checks and
    stand-alone ``validate`` never count.

    Args:
        monitor: the metric to watch, a name given to ``self.log``, e.g. ``"val/loss"``.
        min_delta: the least change that counts as an improvement. Stored signed for the mode,
            as Lightning does (``mode="min"``: ``-min_delta``).
        patience: checks without improvement before stopping.
        verbose: print why it stopped, and each new best.
        mode: ``"min"`` (lower is better) or ``"max"``.
        strict: raise when ``monitor`` was not logged (False: skip the check silently, with a
            ``RuntimeWarning`` on global rank zero when ``verbose``, as Lightning).
        check_finite: stop when the value is NaN or infinite.
        stopping_threshold: stop once the value is at least this good.
        divergence_threshold: stop once the value is worse than this.
        check_on_train_epoch_end: where to check; None chooses as described above.
        log_rank_zero_only: with ``verbose``, print on global rank zero only.

    Raises:
        ConfigurationError: an argument is invalid.
        MonitorNotLoggedError: (``strict``) ``monitor`` was not logged; the message lists the
            metrics that were. A ``ConfigurationError`` and, as Lightning's, a ``RuntimeError``.

    Examples:
        >>> stopper = EarlyStopping(monitor="val/loss", patience=2, min_delta=0.01)
        >>> # Trainer(callbacks=[stopper]).fit(module): with val/loss 1.0, 0.5, 0.495, 0.6 the
        >>> # run stops after the 4th epoch: 0.495 and 0.6 do not beat 0.5 by more than 0.01.
        >>> stopper.stopped_epoch, stopper.stopping_reason  # after fit
        (3, <EarlyStoppingReason.PATIENCE_EXHAUSTED: 3>)
    """

    mode_dict: ClassVar[dict[str, Callable[..., Any]]] = {"min": torch.lt, "max": torch.gt}
    order_dict: ClassVar[dict[str, str]] = {"min": "<", "max": ">"}

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        _check_arguments(monitor, min_delta, patience, mode)
        for name, value in (
            ("stopping_threshold", stopping_threshold),
            ("divergence_threshold", divergence_threshold),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ConfigurationError(
                    f"EarlyStopping({name}={describe(value)}): expected a number or None."
                )
        self.monitor = monitor
        self.mode = mode
        # Lightning's sign: the check is `monitor_op(value - min_delta, best)` in both modes.
        self.min_delta = float(min_delta) * (1 if mode == "max" else -1)
        self.patience = patience
        self.verbose = verbose
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.log_rank_zero_only = log_rank_zero_only
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self._is_epoch_end_check: bool | None = check_on_train_epoch_end  # resolved in setup
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": float(self.best_score),
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a resumed run's counters and why it stopped (absent in older checkpoints).

        Raises:
            CheckpointError: ``stopping_reason`` is not one of `EarlyStoppingReason`'s values, or
                the message is not a string.
        """
        reason = state_dict.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value)
        reason = _OLD_REASON_NAMES[reason].value if reason in _OLD_REASON_NAMES else reason
        message = state_dict.get("stopping_reason_message")
        reasons = [r.value for r in EarlyStoppingReason]
        if (
            isinstance(reason, bool)
            or reason not in reasons
            or not (message is None or isinstance(message, str))
        ):
            raise CheckpointError(
                f"EarlyStopping state ({self.state_key}): stopping_reason={describe(reason)}, "
                f"stopping_reason_message={describe(message)}; expected one of {reasons} and "
                "a string or None. The checkpoint was written by something else or edited."
            )
        self.wait_count = int(state_dict["wait_count"])
        self.stopped_epoch = int(state_dict["stopped_epoch"])
        self.best_score = torch.tensor(float(state_dict["best_score"]))
        self.patience = int(state_dict["patience"])
        self.stopping_reason = EarlyStoppingReason(reason)
        self.stopping_reason_message = message

    # ---- when -----------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._is_epoch_end_check = self._check_on_train_epoch_end
        if self._is_epoch_end_check is None:
            # Validation more or less often than once per epoch: check after each validation.
            self._is_epoch_end_check = (
                trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1
            )  # False for a duration (time-based validation)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._is_epoch_end_check and not self._should_skip(trainer):
            self.check(trainer)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not self._is_epoch_end_check and not self._should_skip(trainer):
            self.check(trainer)

    @staticmethod
    def _should_skip(trainer: Trainer) -> bool:
        return trainer.state.stage != "fit" or trainer.sanity_checking or bool(trainer.fast_dev_run)

    # ---- what -----------------------------------------------------------------------------
    def check(self, trainer: Trainer) -> None:
        """Read ``monitor`` now, update the state, and set ``trainer.should_stop`` if due."""
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (
                f"EarlyStopping(monitor={self.monitor!r}): the metric was not logged; logged "
                f"metrics: {sorted(metrics)}. Log it with self.log({self.monitor!r}, ...), "
                "change monitor, or pass strict=False to skip checks without it."
            )
            if self.strict:
                raise MonitorNotLoggedError(message)
            if self.verbose and trainer.is_global_zero:  # Lightning warns here, not prints
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            return
        current = metrics[self.monitor].detach().float().squeeze().cpu()
        is_local_stop, reason = self._evaluate(current)
        should_stop = trainer.strategy.reduce_boolean_decision(is_local_stop, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = (
                reason if is_local_stop else "EarlyStopping: another process signalled a stop."
            )
        if reason and self.verbose:
            self._print(trainer, reason)

    def _evaluate(self, current: torch.Tensor) -> tuple[bool, str | None]:
        """(stop?, message) for one value; updates ``best_score`` and ``wait_count``. The
        messages are Lightning's, word for word (``stopping_reason_message``)."""
        value, order = float(current), self.order_dict[self.mode]
        if self.check_finite and not math.isfinite(value):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (
                f"Monitored metric {self.monitor} = {current} is not finite. Previous best "
                f"value was {float(self.best_score):.3f}. Signaling Trainer to stop."
            )
        if self.stopping_threshold is not None and self._is_better(value, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (
                f"Stopping threshold reached: {self.monitor} = {current} {order} "
                f"{self.stopping_threshold}. Signaling Trainer to stop."
            )
        if self.divergence_threshold is not None and self._is_better(
            -value, -self.divergence_threshold
        ):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (
                f"Divergence threshold reached: {self.monitor} = {current} {order} "
                f"{self.divergence_threshold}. Signaling Trainer to stop."
            )
        best = float(self.best_score)
        if self._is_better(value - self.min_delta, best):
            if math.isfinite(best):
                message = (
                    f"Metric {self.monitor} improved by {abs(best - value):.3f} >= min_delta = "
                    f"{abs(self.min_delta)}. New best score: {value:.3f}"
                )
            else:
                message = f"Metric {self.monitor} improved. New best score: {value:.3f}"
            self.best_score = current.clone()
            self.wait_count = 0
            return False, message
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (
                f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} "
                f"records. Best score: {best:.3f}. Signaling Trainer to stop."
            )
        return False, None

    @property
    def monitor_op(self) -> Callable[..., Any]:
        """``torch.lt`` (mode "min") or ``torch.gt`` ("max"): whether a value beats another."""
        return self.mode_dict[self.mode]

    def _is_better(self, a: float, b: float) -> bool:
        return bool(self.monitor_op(torch.tensor(a), torch.tensor(b)))

    def _print(self, trainer: Trainer, message: str) -> None:
        if trainer.is_global_zero:
            print(message)
        elif not self.log_rank_zero_only:
            print(f"[rank {trainer.global_rank}] {message}")


def _check_arguments(monitor: object, min_delta: object, patience: object, mode: object) -> None:
    if not isinstance(monitor, str) or not monitor:
        raise ConfigurationError(
            f"EarlyStopping(monitor={describe(monitor)}): expected the name of a logged metric, "
            "e.g. monitor='val/loss'."
        )
    if mode not in ("min", "max"):
        raise ConfigurationError(
            f"EarlyStopping(mode={describe(mode)}): expected 'min' (lower is better) or 'max'."
        )
    if isinstance(min_delta, bool) or not isinstance(min_delta, int | float):
        raise ConfigurationError(
            f"EarlyStopping(min_delta={describe(min_delta)}): expected a number, e.g. 0.001."
        )
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise ConfigurationError(
            f"EarlyStopping(patience={describe(patience)}): expected an int >= 0, e.g. 3."
        )
