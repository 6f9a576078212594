"""LearningRateMonitor: log each optimizer's learning rate (and momentum, weight decay).

This module owns the metric names (Lightning 2.6's: ``lr-<OptimizerClass>``, ``/pg<N>`` or the
group's ``name`` per param group, ``-<N>`` for a repeated class, a scheduler's ``name`` when given)
and when they are written. It reads ``trainer.optimizers`` and ``trainer.lr_scheduler_configs``,
writes to ``trainer.loggers`` and puts the values in ``trainer.callback_metrics`` (so they can be
monitored); it never changes a learning rate.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.logger_rows import is_log_due

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["LearningRateMonitor"]

_INTERVALS = (None, "step", "epoch")


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer to the Trainer's loggers.

    Names follow Lightning: ``lr-SGD`` for one SGD optimizer, ``lr-SGD/pg1``, ``lr-SGD/pg2``
    for several param groups (``lr-SGD/<name>`` when a group has a ``"name"`` key, even a single
    group), ``lr-SGD-1`` for a second SGD optimizer, and the scheduler's ``name`` instead of
    ``lr-SGD`` when ``configure_optimizers`` gives one. ``log_momentum`` adds
    ``<name>-momentum`` (Adam's ``betas[0]``), ``log_weight_decay`` adds ``<name>-weight_decay``.

    When (Lightning's rule): with ``logging_interval=None`` a scheduler stepped per ``"step"``
    is logged at the start of each batch whose step is due for logging
    (``(progress.batches_stepped + 1) % log_every_n_steps == 0``: with gradient accumulation,
    every batch of that step), one stepped per ``"epoch"`` at the start of each epoch, and an optimizer without
    a scheduler at both. ``"step"`` logs every
    optimizer at the due batches only, ``"epoch"`` every optimizer at each epoch start. Rows
    are written at the loggers' step, ``trainer.progress.batches_stepped`` (``global_step``
    under automatic optimization); the values also go to ``trainer.callback_metrics``
    (where ``ModelCheckpoint`` or ``EarlyStopping`` can monitor them) and to ``self.lrs``
    (name -> list of floats).

    Args:
        logging_interval: None (each scheduler at its own interval), ``"step"`` or ``"epoch"``.
        log_momentum: also log the momentum (``momentum``, or ``betas[0]``).
        log_weight_decay: also log ``weight_decay``.

    Raises:
        ConfigurationError: ``logging_interval`` is not None, "step" or "epoch"; fit starts
            with no logger (``Trainer(logger=False)``); or one optimizer has two param groups
            with the same ``name``.

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
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.loggers:
            raise ConfigurationError(
                "LearningRateMonitor needs a logger, but the Trainer has none (logger=False). "
                "Pass Trainer(logger=True) or a Logger, or remove the callback."
            )
        if self.log_momentum and not self._has_momentum(trainer):
            warnings.warn(
                "You have set log_momentum=True, but some optimizers do not have momentum. "
                "This will log a value 0 for the momentum.",
                RuntimeWarning,
                stacklevel=2,
            )
        names = [name for _, group_names in self._named_optimizers(trainer) for name in group_names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    def on_train_batch_start(
        self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int
    ) -> None:
        if self.logging_interval == "epoch":
            return
        # Lightning's rule, checked per batch: with accumulation each batch of a due step logs.
        # The loggers' step (Lightning's batches that stepped), not global_step: with manual
        # optimization of two optimizers global_step counts two per batch.
        if not is_log_due(trainer.progress.batches_stepped + 1, trainer):
            return
        self._log(trainer, self.extract_stats(trainer, "any" if self.logging_interval else "step"))

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self.logging_interval == "step":
            return
        self._log(trainer, self.extract_stats(trainer, "any" if self.logging_interval else "epoch"))

    def extract_stats(self, trainer: Trainer, interval: str) -> dict[str, float]:
        """The current values to log for schedulers stepped per ``interval`` ("step",
        "epoch", or "any"), plus every optimizer without a scheduler; also put in
        ``trainer.callback_metrics``.

        Raises:
            ConfigurationError: an optimizer has two param groups with the same ``name``.

        Examples:
            >>> LearningRateMonitor().extract_stats(trainer, "any")  # one SGD(lr=0.1)
            {'lr-SGD': 0.1}
        """
        stats: dict[str, float] = {}
        for (optimizer, config), names in self._named_optimizers(trainer):
            if config is not None and interval not in ("any", config.interval):
                continue
            stats.update(self._optimizer_stats(optimizer, names))
        trainer.callback_metrics.update(
            {
                name: torch.tensor(value, device=trainer.strategy.root_device)
                for name, value in stats.items()
            }
        )
        return stats

    def _named_optimizers(self, trainer: Trainer) -> list[tuple[tuple[Any, Any], list[str]]]:
        """``((optimizer, scheduler config or None), one name per param group)``, Lightning's
        order: optimizers with a scheduler first (in scheduler order), then the others."""
        named: list[tuple[tuple[Any, Any], list[str]]] = []
        seen: list[Any] = []
        class_counts: dict[type, int] = {}
        for config in trainer.lr_scheduler_configs:
            optimizer = _unwrap(config.scheduler.optimizer)
            base = config.name if config.name is not None else f"lr-{type(optimizer).__name__}"
            names = self._group_names(optimizer, base, class_counts, count=config.name is None)
            named.append(((optimizer, config), names))
            seen.append(optimizer)
        for wrapped in trainer.optimizers:
            optimizer = _unwrap(wrapped)
            if any(optimizer is other for other in seen):
                continue
            seen.append(optimizer)
            base = f"lr-{type(optimizer).__name__}"
            named.append(((optimizer, None), self._group_names(optimizer, base, class_counts)))
        return named

    @staticmethod
    def _group_names(
        optimizer: Any, base: str, class_counts: dict[type, int], *, count: bool = True
    ) -> list[str]:
        """One metric name per param group: ``-<N>`` for a repeated class, ``/pg<i>`` or the
        group's ``name``; a name used twice in one optimizer is refused (as Lightning)."""
        klass = type(optimizer)
        if count:
            class_counts[klass] = class_counts.get(klass, 0) + 1
        groups = optimizer.param_groups
        group_names = [group.get("name", f"pg{i}") for i, group in enumerate(groups, start=1)]
        duplicates = {name for name in group_names if group_names.count(name) > 1}
        if duplicates:
            raise ConfigurationError(
                "A single `Optimizer` cannot have multiple parameter groups with identical "
                f"`name` values. {base} has duplicated parameter group names {sorted(duplicates)}. "
                "Give each param group of the optimizer its own name."
            )
        if class_counts.get(klass, 0) > 1:
            base += f"-{class_counts[klass] - 1}"
        if len(groups) > 1:
            return [f"{base}/{name}" for name in group_names]
        name = groups[0].get("name") if groups else None
        return [f"{base}/{name}" if name else base]

    def _optimizer_stats(self, optimizer: Any, names: list[str]) -> dict[str, float]:
        uses_betas = "betas" in optimizer.defaults
        stats: dict[str, float] = {}
        for group, name in zip(optimizer.param_groups, names):
            stats[name] = float(group["lr"])
            self.lrs.setdefault(name, []).append(stats[name])
            if self.log_momentum:
                momentum = group["betas"][0] if uses_betas else group.get("momentum", 0)
                stats[f"{name}-momentum"] = float(momentum)
                self.last_momentum_values[f"{name}-momentum"] = float(momentum)
            if self.log_weight_decay:
                weight_decay = float(group.get("weight_decay", 0.0))
                stats[f"{name}-weight_decay"] = weight_decay
                self.last_weight_decay_values[f"{name}-weight_decay"] = weight_decay
        return stats

    @staticmethod
    def _has_momentum(trainer: Trainer) -> bool:
        """Lightning's check: no warning unless some optimizer lacks ``momentum`` and some
        (maybe another) lacks ``betas``; with schedulers only theirs are looked at."""
        optimizers = [
            _unwrap(opt)
            for opt in (
                [config.scheduler.optimizer for config in trainer.lr_scheduler_configs]
                or trainer.optimizers
            )
        ]
        return not all(
            any(key not in opt.defaults for opt in optimizers) for key in ("momentum", "betas")
        )

    def _log(self, trainer: Trainer, stats: dict[str, float]) -> None:
        if stats and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=trainer.progress.batches_stepped)


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside a prepared (or DeepSpeed) wrapper."""
    return getattr(optimizer, "optimizer", optimizer)
