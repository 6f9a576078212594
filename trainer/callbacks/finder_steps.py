"""What both finders (LearningRateFinder, BatchSizeFinder) share: trial training steps and undoing them.

`TrainingState` captures what trial steps change (weights, optimizer and precision state, RNG,
accumulation position) and puts it back exactly; `run_training_steps` runs a number of optimizer
steps over a train loader, each batch through the Trainer's own step path
(`trainer.trainer.batch_step.trial_step`: the fit's accumulation, clipping, precision, optimizer
step and ``zero_grad``, with the module's hooks and no callback's). This module owns which
batches a trial draws and when it stops, not how a batch is trained; the Trainer's progress
does not move.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError
from trainer.runtime.seed import get_rng_states, set_rng_states
from trainer.trainer.batch_step import BatchStep, trial_step
from trainer.trainer.log_refusal import logging_allowed
from trainer.trainer.mode_hooks import capture_modes, put_modes

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = [
    "TrainingState",
    "run_training_steps",
    "train_loader",
]


def _to_cpu(value: Any) -> Any:
    """A deep copy of ``value`` with every tensor on the CPU (keeps accelerator memory free)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(item) for item in value)
    return copy.deepcopy(value)


@dataclass
class TrainingState:
    """What a finder's trial steps change, captured to be put back exactly."""

    trainer: Trainer
    module: TrainModule
    weights: dict[str, torch.Tensor]
    optimizers: list[dict[str, Any]]
    precision: dict[str, Any]
    rng: dict[str, Any]
    accumulation: tuple[int, bool]
    modes: dict[str, bool]  # each submodule's train / eval mode

    @classmethod
    def capture(cls, trainer: Trainer, module: TrainModule) -> TrainingState:
        gradient_state = trainer.accelerator.gradient_state
        return cls(
            trainer=trainer,
            module=module,
            weights=_to_cpu(module.state_dict()),
            optimizers=[_to_cpu(optimizer.state_dict()) for optimizer in trainer.optimizers],
            precision=_to_cpu(trainer.precision_plugin.state_dict()),
            rng=get_rng_states(),
            accumulation=(gradient_state.step, gradient_state.sync_gradients),
            modes=capture_modes(module),
        )

    def restore(self) -> None:
        module = self.module
        module.zero_grad(set_to_none=True)
        module.load_state_dict(self.weights)
        for optimizer, state in zip(self.trainer.optimizers, self.optimizers, strict=True):
            optimizer.load_state_dict(copy.deepcopy(state))
        self.trainer.precision_plugin.load_state_dict(copy.deepcopy(self.precision))
        set_rng_states(self.rng)
        gradient_state = self.trainer.accelerator.gradient_state
        gradient_state.step, gradient_state.sync_gradients = self.accumulation
        put_modes(module, self.modes)


def train_loader(trainer: Trainer) -> Any:
    """The prepared train dataloader of the running fit."""
    loader = trainer.train_dataloader
    if loader is None:
        raise ConfigurationError(
            "the finders run at on_fit_start and need the fit's train dataloader; none is set up."
        )
    return loader


def run_training_steps(
    trainer: Trainer,
    loader: Any,
    num_steps: int,
    *,
    before_step: Callable[[int], None] | None = None,
    after_step: Callable[[int, float], bool] | None = None,
) -> int:
    """Run up to ``num_steps`` optimizer steps over ``loader`` through the fit's step path.

    Each batch goes through the Trainer's own batch step (`trainer.trainer.batch_step`, built by
    `trial_step`): ``training_step`` and its loss check, accumulation, ``zero_grad``, backward,
    clipping, precision and the optimizer step, with the module's hooks and no callback's. The
    Trainer's progress does not move. ``batch_idx`` counts from 0 on each pass over ``loader``,
    which starts again when the trial needs more steps than it has; the module's
    ``on_train_batch_start`` returning -1 ends the pass (Lightning ends the epoch), and a pass
    that takes no step ends the trial.

    Args:
        trainer: the running Trainer (from ``on_fit_start`` on).
        loader: the prepared train dataloader to draw batches from.
        num_steps: the most optimizer steps to run.
        before_step: ``before_step(i)`` runs before the first batch of step ``i``.
        after_step: ``after_step(i, loss)`` gets step ``i``'s loss as Lightning's LR finder
            reads it, the loss of the step's last batch divided by ``accumulate_grad_batches``
            (nan when that batch returned no loss), and returns True to stop.

    Returns:
        The number of optimizer steps run.

    Raises:
        ConfigurationError: ``loader`` yielded no batch.
    """
    if num_steps < 1:
        return 0
    trial = _Trial(
        trial_step(trainer), num_steps, before_step, after_step, trainer.accumulate_grad_batches
    )
    if before_step is not None:
        before_step(0)
    with logging_allowed(trainer.module):  # self.log in training_step, as in fit's steps
        while not trial.is_done:
            steps_before = trial.steps
            if trial.run_pass(loader) == 0:
                raise ConfigurationError(
                    "the train dataloader yielded no batch; the finders need at least one."
                )
            if trial.steps == steps_before:  # every pass would end the same way
                break
    return trial.steps


class _Trial:
    """The steps of one `run_training_steps`: their count, the last batch's loss, the end."""

    def __init__(
        self,
        step: BatchStep,
        num_steps: int,
        before_step: Callable[[int], None] | None,
        after_step: Callable[[int, float], bool] | None,
        accumulate_grad_batches: int,
    ) -> None:
        self._step = step
        self._num_steps = num_steps
        self._before_step = before_step
        self._after_step = after_step
        self._accumulate_grad_batches = accumulate_grad_batches
        self._last_loss = math.nan
        self.steps = 0
        self.is_done = False

    def run_pass(self, loader: Any) -> int:
        """One pass over ``loader`` until it ends, the module skips, or the trial is done;
        return the number of batches drawn."""
        step = self._step
        iterator = iter(loader)
        count = 0
        try:
            for batch_idx, batch in enumerate(iterator):
                count += 1
                if step.start_batch(batch, batch_idx):  # on_train_batch_start returned -1
                    break
                output, loss, is_stepping = step.step_batch(batch, batch_idx)
                step.end_batch(output, batch, batch_idx)
                self._last_loss = math.nan if loss is None else float(loss.detach())
                if is_stepping and self._end_step():
                    self.is_done = True
                    break
        finally:
            if hasattr(iterator, "close"):
                iterator.close()  # ends the prepared loader's iteration (accumulation bookkeeping)
        return count

    def _end_step(self) -> bool:
        """Count the step and report its loss (`run_training_steps`); True when the trial is over."""
        loss = self._last_loss / self._accumulate_grad_batches  # Lightning's on_train_batch_end
        self.steps += 1
        if self._after_step is not None and self._after_step(self.steps - 1, loss):
            return True
        if self.steps >= self._num_steps:
            return True
        if self._before_step is not None:
            self._before_step(self.steps)
        return False
