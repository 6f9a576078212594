"""GradientAccumulationScheduler: change ``accumulate_grad_batches`` by epoch.

This module owns the schedule (checked when built) and sets ``trainer.accumulate_grad_batches``
at the start of each training epoch; the Trainer passes the value on to its Accelerator, which
does the accumulating. The last batch of an epoch always steps, whatever the factor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["GradientAccumulationScheduler"]


class GradientAccumulationScheduler(Callback):
    """Accumulate gradients over a number of batches that changes with the epoch.

    ``scheduling`` maps the first epoch (0-based) of each phase to its factor; epochs before
    the first key use 1. Do not also pass ``Trainer(accumulate_grad_batches=...)``.

    Args:
        scheduling: ``{epoch: accumulate_grad_batches}``, e.g. ``{0: 1, 4: 2, 8: 4}``.

    Raises:
        ConfigurationError: ``scheduling`` is empty, a key is not an int >= 0, or a value is
            not an int >= 1; at fit start, the module uses manual optimization or the Trainer
            was given its own ``accumulate_grad_batches``.

    Examples:
        >>> scheduler = GradientAccumulationScheduler(scheduling={1: 2, 2: 4})
        >>> [scheduler.get_accumulate_grad_batches(epoch) for epoch in range(4)]
        [1, 2, 4, 4]
        >>> # with 8 batches per epoch, fit(max_epochs=3) takes 8 + 4 + 2 = 14 optimizer steps
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not isinstance(scheduling, dict) or not scheduling:
            raise ConfigurationError(
                f"GradientAccumulationScheduler(scheduling={describe(scheduling)}): expected a "
                "non-empty dict {epoch: factor}, e.g. {0: 1, 4: 2}."
            )
        bad_epochs = [k for k in scheduling if type(k) is not int or k < 0]
        if bad_epochs:
            raise ConfigurationError(
                f"GradientAccumulationScheduler(scheduling={scheduling!r}): the keys are epochs "
                f"and must be ints >= 0; received {bad_epochs}."
            )
        bad_factors = [v for v in scheduling.values() if type(v) is not int or v < 1]
        if bad_factors:
            raise ConfigurationError(
                f"GradientAccumulationScheduler(scheduling={scheduling!r}): the values are "
                f"accumulation factors and must be ints >= 1; received {bad_factors}."
            )
        self.scheduling = {0: 1, **scheduling} if 0 not in scheduling else dict(scheduling)
        self.epochs = sorted(self.scheduling)
        self._last_set: int | None = None

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether any phase accumulates (a factor above 1)."""
        return any(value > 1 for value in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor for ``epoch``: that of the last phase starting at or before it."""
        start = max((first for first in self.epochs if first <= epoch), default=0)
        return self.scheduling.get(start, 1)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not module.automatic_optimization:
            raise ConfigurationError(
                f"GradientAccumulationScheduler: {type(module).__name__} uses manual "
                "optimization (automatic_optimization = False), where the module steps its "
                "optimizers itself. Accumulate in training_step, or remove the callback."
            )
        given = trainer.accumulate_grad_batches
        if given != 1 and given != self._last_set:
            raise ConfigurationError(
                f"GradientAccumulationScheduler: Trainer(accumulate_grad_batches={given}) was "
                "also given. Use one of the two: put the factor in scheduling, e.g. "
                f"{{0: {given}}}."
            )

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._last_set = self.get_accumulate_grad_batches(trainer.current_epoch)
        trainer.accumulate_grad_batches = self._last_set
