"""What both finders (LearningRateFinder, BatchSizeFinder) share: trial training steps and undoing them.

`TrainingState` captures what trial steps change (weights, optimizer and precision state, RNG,
accumulation position) and puts it back exactly; `run_training_steps` runs optimizer steps of
``training_step`` over the fit's prepared train loader through the Trainer's accelerator, with
the Trainer's accumulation and clipping and no hooks; the Trainer's progress does not move.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError, HookResultError, describe
from trainer.runtime.seed import get_rng_states, set_rng_states

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = [
    "TrainingState",
    "bad_argument",
    "is_int",
    "is_number",
    "run_training_steps",
    "train_loader",
]


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bad_argument(owner: str, name: str, value: Any, expected: str) -> ConfigurationError:
    """The error for a bad constructor argument: names it, shows the value, says what fits."""
    return ConfigurationError(f"{owner}({name}={describe(value)}): expected {expected}.")


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
    was_training: bool

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
            was_training=module.training,
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
        module.train(self.was_training)


def train_loader(trainer: Trainer) -> Any:
    """The prepared train dataloader of the running fit."""
    loader = trainer.train_dataloader
    if loader is None:
        raise ConfigurationError(
            "the finders run at on_fit_start and need the fit's train dataloader; none is set up."
        )
    return loader


def _step_function(trainer: Trainer, module: TrainModule) -> Callable[[Any, int], Any]:
    """``training_step`` through the prepared model (DDP/FSDP wrappers see the forward)."""
    model = trainer.model
    return module.training_step if model is None else partial(model, "training_step")


def _loss_of(output: Any, who: str) -> torch.Tensor | None:
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    raise HookResultError(
        f"training_step returned {describe(output)} during {who}; expected a Tensor, a dict with "
        '"loss", or None. Return the loss tensor.'
    )


def _cycle(loader: Any) -> Iterator[Any]:
    """The loader's batches, over and over (a trial may need more steps than one epoch has)."""
    while True:
        iterator = iter(loader)
        is_empty = True
        try:
            for batch in iterator:
                is_empty = False
                yield batch
        finally:
            if hasattr(iterator, "close"):
                iterator.close()  # ends the prepared loader's iteration (accumulation bookkeeping)
        if is_empty:
            raise ConfigurationError(
                "the train dataloader yielded no batch; the finders need at least one."
            )


def run_training_steps(
    trainer: Trainer,
    module: TrainModule,
    loader: Any,
    num_steps: int,
    *,
    who: str,
    before_step: Callable[[int], None] | None = None,
    after_step: Callable[[int, float], bool] | None = None,
) -> int:
    """Run up to ``num_steps`` optimizer steps of ``training_step`` over ``loader``; no hooks.

    Gradient accumulation and clipping follow the Trainer's settings. ``before_step(i)`` runs
    before step ``i``'s first batch; ``after_step(i, loss)`` gets the step's mean loss (nan when
    every batch was skipped) and returns True to stop. Returns the number of steps run.
    """
    accelerator = trainer.accelerator
    step_function = _step_function(trainer, module)
    is_automatic = module.automatic_optimization
    optimizer = trainer.optimizers[0] if is_automatic else None
    if num_steps < 1:
        return 0
    module.train()
    losses: list[float] = []
    steps = 0
    if before_step is not None:
        before_step(0)
    batches = _cycle(loader)
    try:
        for batch_idx, batch in enumerate(batches):
            if optimizer is None:  # manual optimization: the step does its own updates
                with accelerator.autocast():
                    loss = _loss_of(step_function(batch, batch_idx), who)
                is_step = True
            else:
                with accelerator.accumulate(module):
                    with accelerator.autocast():
                        loss = _loss_of(step_function(batch, batch_idx), who)
                    if loss is not None:
                        accelerator.backward(loss)
                    is_step = accelerator.sync_gradients
                    if is_step:
                        _clip_gradients(trainer, module.parameters())
                        optimizer.step()
                        optimizer.zero_grad()
            if loss is not None:
                losses.append(float(loss.detach()))
            if not is_step:
                continue
            mean_loss = sum(losses) / len(losses) if losses else math.nan
            losses.clear()
            steps += 1
            if after_step is not None and after_step(steps - 1, mean_loss):
                break
            if steps >= num_steps:
                break
            if before_step is not None:
                before_step(steps)
    finally:
        batches.close()
    return steps


def _clip_gradients(trainer: Trainer, parameters: Iterator[torch.Tensor]) -> None:
    accelerator, value = trainer.accelerator, trainer.gradient_clip_val
    if value is not None:
        is_norm = trainer.gradient_clip_algorithm == "norm"
        (accelerator.clip_grad_norm_ if is_norm else accelerator.clip_grad_value_)(
            parameters, value
        )
