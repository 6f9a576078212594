"""LearningRateMonitor: log each optimizer's learning rate (and momentum, weight decay).

This module owns the metric names (Lightning's: ``lr-<OptimizerClass>``, ``/pg<N>`` per param
group, ``-<N>`` for a repeated class, a scheduler's ``name`` when given) and when they are
written. It reads ``trainer.optimizers`` and ``trainer.lr_scheduler_configs`` and writes to
``trainer.loggers`` on global rank zero; it never changes a learning rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["LearningRateMonitor"]

_INTERVALS = (None, "step", "epoch")


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer to the Trainer's loggers.

    Names follow Lightning: ``lr-SGD`` for one SGD optimizer, ``lr-SGD/pg1``, ``lr-SGD/pg2``
    for several param groups (``lr-SGD/<name>`` when a group has a ``"name"`` key), ``lr-SGD-1``
    for a second SGD optimizer, and the scheduler's ``name`` instead of ``lr-SGD`` when
    ``configure_optimizers`` gives one. ``log_momentum`` adds ``<name>-momentum`` (Adam's
    ``betas[0]``), ``log_weight_decay`` adds ``<name>-weight_decay``.

    When: a scheduler stepped per ``"step"`` is logged at the start of a batch whose step is
    due for logging (``(global_step + 1) % log_every_n_steps == 0``), at ``step=global_step``;
    one stepped per ``"epoch"`` at the start of each epoch. ``logging_interval`` keeps only
    one of the two; an optimizer without a scheduler is logged at both. Values are also kept
    in ``self.lrs`` (name -> list of floats).

    Args:
        logging_interval: None (each scheduler at its own interval), ``"step"`` or ``"epoch"``.
        log_momentum: also log the momentum (``momentum``, or ``betas[0]``).
        log_weight_decay: also log ``weight_decay``.

    Raises:
        ConfigurationError: ``logging_interval`` is not None, "step" or "epoch"; or fit starts
            with no logger (``Trainer(logger=False)``).

    Examples:
        >>> monitor = LearningRateMonitor(logging_interval="epoch")
        >>> # SGD(lr=0.1) with StepLR(step_size=1, gamma=0.5), 3 epochs of 8 batches:
        >>> # the loggers receive {"lr-SGD": 0.1} at step 0, 0.05 at step 8, 0.025 at step 16.
    """

    def __init__(
        self,
        logging_interval: str | None = None,
        log_momentum: bool = False,
        log_weight_decay: bool = False,
    ) -> None:
        if logging_interval not in _INTERVALS:
            raise ConfigurationError(
                f"LearningRateMonitor(logging_interval={describe(logging_interval)}): expected "
                "None, 'step' or 'epoch'."
            )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self._last_step_logged = -1

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.loggers:
            raise ConfigurationError(
                "LearningRateMonitor needs a logger, but the Trainer has none (logger=False). "
                "Pass Trainer(logger=True) or a Logger, or remove the callback."
            )
        self._last_step_logged = -1

    def on_train_batch_start(
        self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int
    ) -> None:
        if self.logging_interval == "epoch":
            return
        step = trainer.global_step
        # With accumulation several batches share a step: log it once.
        if (step + 1) % trainer.log_every_n_steps != 0 or step == self._last_step_logged:
            return
        self._last_step_logged = step
        self._log(trainer, self.extract_stats(trainer, "step"))

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self.logging_interval == "step":
            return
        self._log(trainer, self.extract_stats(trainer, self.logging_interval or "epoch"))

    def extract_stats(self, trainer: Trainer, interval: str) -> dict[str, float]:
        """The current values to log for schedulers stepped per ``interval`` ("step",
        "epoch", or "any"), plus every optimizer without a scheduler.

        Examples:
            >>> LearningRateMonitor().extract_stats(trainer, "any")  # one SGD(lr=0.1)
            {'lr-SGD': 0.1}
        """
        scheduled = {
            id(config.scheduler.optimizer): config for config in trainer.lr_scheduler_configs
        }
        stats: dict[str, float] = {}
        seen: dict[str, int] = {}
        for optimizer in trainer.optimizers:
            inner = getattr(optimizer, "optimizer", optimizer)  # a prepared wrapper's optimizer
            class_name = type(inner).__name__
            seen[class_name] = seen.get(class_name, 0) + 1
            config = scheduled.get(id(inner)) or scheduled.get(id(optimizer))
            if config is not None and interval not in ("any", config.interval):
                continue
            base = f"lr-{class_name}"
            if seen[class_name] > 1:
                base += f"-{seen[class_name] - 1}"
            if config is not None and config.name:
                base = config.name
            stats.update(self._optimizer_stats(inner, base))
        return stats

    def _optimizer_stats(self, optimizer: Any, base: str) -> dict[str, float]:
        groups = optimizer.param_groups
        stats: dict[str, float] = {}
        for index, group in enumerate(groups):
            name = base
            if len(groups) > 1:
                name = f"{base}/{group.get('name') or f'pg{index + 1}'}"
            stats[name] = float(group["lr"])
            if self.log_momentum:
                momentum = group.get("betas", (group.get("momentum", 0.0),))[0]
                stats[f"{name}-momentum"] = float(momentum)
            if self.log_weight_decay:
                stats[f"{name}-weight_decay"] = float(group.get("weight_decay", 0.0))
        return stats

    def _log(self, trainer: Trainer, stats: dict[str, float]) -> None:
        for name, value in stats.items():
            self.lrs.setdefault(name, []).append(value)
        if stats and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=trainer.global_step)
