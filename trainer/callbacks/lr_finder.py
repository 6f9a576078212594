"""LearningRateFinder: the learning-rate range test at the start of fit, its suggestion and plot.

This module owns the range test (training steps with a growing learning rate, run through the
Trainer's accelerator and prepared optimizer over the train dataloader), the smoothing and early
stop, the suggestion, the plot, and putting the module, optimizer, precision and RNG state back
as they were. It also holds what both finders share: `_TrainingState` (capture/restore)
and `_run_training_steps`. It does not own the loop: no hook runs during the test and the
Trainer's progress (global step, epoch) does not move.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from trainer._imports import require
from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, HookResultError, describe
from trainer.runtime.seed import get_rng_states, set_rng_states

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["LearningRateFinder"]

_MODES = ("exponential", "linear")
_SMOOTHING = 0.98  # weight of the running mean of the loss (Lightning's beta)


# ---- shared by the finders ---------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(owner: str, name: str, value: Any, expected: str) -> ConfigurationError:
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
class _TrainingState:
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
    def capture(cls, trainer: Trainer, module: TrainModule) -> _TrainingState:
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


def _train_loader(trainer: Trainer) -> Any:
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


def _run_training_steps(
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


# ---- the range test ------------------------------------------------------------------------------
class LearningRateFinder(Callback):
    """Find a starting learning rate with the range test (Smith, 2017), Lightning's semantics.

    At ``on_fit_start`` of a fresh fit (a resumed one keeps its learning rate) the callback
    captures the module, optimizer, precision and RNG state (on the CPU), runs
    ``num_training_steps`` optimizer steps while the learning rate grows from ``min_lr`` to
    ``max_lr`` (geometric or equal steps, per ``mode``) and records each step's learning rate and
    smoothed loss. It stops early when the smoothed loss exceeds ``early_stop_threshold`` times
    the best one (or is not finite), puts the state back, and suggests the learning rate where
    the loss falls fastest (`suggestion`). With ``update_attr`` the suggestion goes to
    ``module.<attr_name>`` / ``module.hparams[attr_name]``, the optimizer's parameter groups and
    its schedulers' ``base_lrs``, so the fit trains with it. No hook runs during the test.

    Args:
        min_lr: the first learning rate of the test.
        max_lr: the last learning rate of the test.
        num_training_steps: optimizer steps of the test (the loader is cycled when shorter).
        mode: "exponential" or "linear" growth of the learning rate.
        early_stop_threshold: stop when the smoothed loss exceeds this times the best; None
            never stops early.
        update_attr: write the suggestion to the module and the optimizer.
        attr_name: the module attribute or ``hparams`` key that holds the learning rate.

    Attributes:
        results: ``{"lr": [...], "loss": [...]}``, one entry per step (loss smoothed).
        suggested_lr: the suggestion of the last test, or None.

    Raises:
        ConfigurationError: an argument is out of range (the message names it), several
            optimizers, or ``update_attr`` with no ``attr_name`` on the module.

    Examples:
        >>> finder = LearningRateFinder(min_lr=1e-6, max_lr=1.0, num_training_steps=100)
        >>> Trainer(max_epochs=5, callbacks=[finder]).fit(module)  # module.hparams.lr = 1e-5
        >>> finder.suggested_lr, module.hparams.lr  # e.g. (0.0912, 0.0912)
        >>> finder.plot(path="lr_find.png")
    """

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "lr",
    ) -> None:
        for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
            if not _is_number(value) or value <= 0:
                raise _bad("LearningRateFinder", name, value, "a float > 0")
        if not min_lr < max_lr:
            raise _bad("LearningRateFinder", "min_lr", min_lr, f"a value below max_lr={max_lr}")
        if not _is_int(num_training_steps) or num_training_steps < 2:
            steps = num_training_steps
            raise _bad("LearningRateFinder", "num_training_steps", steps, "an int >= 2, e.g. 100")
        if mode not in _MODES:
            raise _bad("LearningRateFinder", "mode", mode, "'exponential' or 'linear'")
        threshold = early_stop_threshold
        if threshold is not None and (not _is_number(threshold) or threshold <= 0):
            raise _bad(
                "LearningRateFinder", "early_stop_threshold", threshold, "a float > 0 or None"
            )
        if not isinstance(attr_name, str) or not attr_name:
            raise _bad("LearningRateFinder", "attr_name", attr_name, "a name such as 'lr'")
        self.min_lr = float(min_lr)
        self.max_lr = float(max_lr)
        self.num_training_steps = num_training_steps
        self.mode = mode
        self.early_stop_threshold = early_stop_threshold
        self.update_attr = update_attr
        self.attr_name = attr_name
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self.suggested_lr: float | None = None

    # ---- hooks ---------------------------------------------------------------------------
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.fast_dev_run:
            warnings.warn("LearningRateFinder: skipped because fast_dev_run is set.", stacklevel=2)
            return
        if trainer.global_step > 0:  # resumed: the optimizer's learning rate was restored
            if self.update_attr and self.suggested_lr is not None:
                self._set_attr(module, self.suggested_lr)
            return
        self.lr_find(trainer, module)

    def state_dict(self) -> dict[str, Any]:
        return {"results": self.results, "suggested_lr": self.suggested_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.results = state_dict.get("results", {"lr": [], "loss": []})
        self.suggested_lr = state_dict.get("suggested_lr")

    # ---- the test ------------------------------------------------------------------------
    def lr_find(self, trainer: Trainer, module: TrainModule) -> float | None:
        """Run the range test now, restore the state, apply and return the suggestion.

        Called at ``on_fit_start``; a subclass may call it from other hooks too (say, at the
        start of an epoch where layers are unfrozen).
        """
        if len(trainer.optimizers) != 1:
            raise ConfigurationError(
                f"LearningRateFinder works with one optimizer; configure_optimizers returned "
                f"{len(trainer.optimizers)}. Return a single optimizer."
            )
        if self.update_attr:
            self._check_attr(module)
        loader = _train_loader(trainer)
        test = _RangeTest(self.early_stop_threshold)
        schedule = self.learning_rates()
        optimizer = trainer.optimizers[0]

        def set_lr(step: int) -> None:
            for group in optimizer.param_groups:
                group["lr"] = schedule[step]

        def record(step: int, loss: float) -> bool:
            # every process stops together, or none
            return trainer.strategy.reduce_boolean_decision(
                test.record(schedule[step], loss), all=False
            )

        state = _TrainingState.capture(trainer, module)
        try:
            _run_training_steps(
                trainer,
                module,
                loader,
                self.num_training_steps,
                who="LearningRateFinder",
                before_step=set_lr,
                after_step=record,
            )
        finally:
            state.restore()
        self.results = trainer.strategy.broadcast({"lr": test.lrs, "loss": test.losses}, src=0)
        self.suggested_lr = self.suggestion()
        if self.suggested_lr is None:
            warnings.warn(
                f"LearningRateFinder: {len(test.losses)} steps ran, too few finite losses beyond "
                "the first 10 and the last one to suggest a learning rate; the learning rate is "
                "unchanged. Raise num_training_steps or lower max_lr.",
                stacklevel=2,
            )
        elif self.update_attr:
            self._apply(trainer, module, self.suggested_lr)
        return self.suggested_lr

    def learning_rates(self) -> list[float]:
        """The learning rate of each step of the test."""
        last = self.num_training_steps - 1
        low, high = self.min_lr, self.max_lr
        if self.mode == "exponential":
            return [low * (high / low) ** (i / last) for i in range(last + 1)]
        return [low + (high - low) * i / last for i in range(last + 1)]

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss falls fastest (Lightning's method).

        The loss curve without its first ``skip_begin`` and last ``skip_end`` points and without
        non-finite losses is differentiated with ``torch.gradient`` against the learning rate
        (its log10 in exponential mode); the steepest negative slope wins. None when fewer than
        two points remain.
        """
        index = self._suggestion_index(skip_begin, skip_end)
        return None if index is None else self.results["lr"][index]

    def _suggestion_index(self, skip_begin: int = 10, skip_end: int = 1) -> int | None:
        count = len(self.results["loss"])
        positions = torch.arange(count)[skip_begin : count - skip_end]
        losses = torch.tensor(self.results["loss"], dtype=torch.float64)[positions]
        lrs = torch.tensor(self.results["lr"], dtype=torch.float64)[positions]
        is_finite = torch.isfinite(losses)
        positions, losses, lrs = positions[is_finite], losses[is_finite], lrs[is_finite]
        if len(losses) < 2:
            return None
        spacing = lrs.log10() if self.mode == "exponential" else lrs
        gradients = torch.gradient(losses, spacing=[spacing])[0]
        return int(positions[torch.argmin(gradients)])

    # ---- applying the suggestion ---------------------------------------------------------
    def _check_attr(self, module: TrainModule) -> None:
        if not (hasattr(module, self.attr_name) or self.attr_name in module.hparams):
            raise ConfigurationError(
                f"LearningRateFinder(attr_name={self.attr_name!r}): {type(module).__name__} has "
                f"no attribute or hparams entry {self.attr_name!r} to update. Store the learning "
                "rate there (self.save_hyperparameters() with an `lr` argument), pass the right "
                "attr_name, or set update_attr=False."
            )

    def _set_attr(self, module: TrainModule, lr: float) -> None:
        if self.attr_name in module.hparams:
            module.hparams[self.attr_name] = lr
        if hasattr(module, self.attr_name):
            setattr(module, self.attr_name, lr)

    def _apply(self, trainer: Trainer, module: TrainModule, lr: float) -> None:
        """The fit trains with ``lr``: module attribute, parameter groups, schedulers' bases."""
        self._set_attr(module, lr)
        optimizer = trainer.optimizers[0]
        for group in optimizer.param_groups:
            group["lr"] = lr
            if "initial_lr" in group:
                group["initial_lr"] = lr
        inner = getattr(optimizer, "optimizer", optimizer)
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if getattr(scheduler, "optimizer", None) in (optimizer, inner) and hasattr(
                scheduler, "base_lrs"
            ):
                scheduler.base_lrs = [lr] * len(scheduler.base_lrs)

    # ---- plot ----------------------------------------------------------------------------
    def plot(self, suggest: bool = True, path: str | os.PathLike[str] | None = None) -> Any:
        """Plot the smoothed loss against the learning rate; save it to ``path`` when given.

        The x axis is logarithmic in exponential mode; ``suggest`` marks the suggestion with a
        red dot. Needs matplotlib (``pip install 'trainer[plot]'``).

        Returns:
            The ``matplotlib.figure.Figure``.

        Examples:
            >>> finder.plot(path="lr_find.png")  # a PNG of 640 x 480 pixels
        """
        if not self.results["lr"]:
            raise ConfigurationError(
                "LearningRateFinder.plot: there are no results yet. Run fit with the callback "
                "(or call lr_find) first."
            )
        figure_module = require(
            "matplotlib.figure", extra="plot", feature="LearningRateFinder.plot"
        )
        figure = figure_module.Figure(figsize=(6.4, 4.8), dpi=100)
        axes = figure.add_subplot()
        lrs, losses = self.results["lr"], self.results["loss"]
        axes.plot(lrs, losses, label="smoothed loss")
        if self.mode == "exponential":
            axes.set_xscale("log")
        axes.set_xlabel("learning rate")
        axes.set_ylabel("loss")
        index = self._suggestion_index() if suggest else None
        if index is not None:
            label = f"suggestion {lrs[index]:.3g}"
            axes.plot(lrs[index], losses[index], "o", color="red", markersize=10, label=label)
        axes.legend()
        axes.grid(True, which="both", alpha=0.3)
        if path is not None:
            figure.savefig(os.fspath(path))
        return figure


class _RangeTest:
    """The smoothed-loss record of one test and its early-stop rule."""

    def __init__(self, early_stop_threshold: float | None) -> None:
        self.early_stop_threshold = early_stop_threshold
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self._running = 0.0
        self._count = 0  # finite losses folded into the running mean
        self._best = math.inf

    def record(self, lr: float, loss: float) -> bool:
        """Add one step; return True when the test should stop (diverged)."""
        if math.isnan(loss):  # every batch of the step was skipped: nothing to smooth
            self.lrs.append(lr)
            self.losses.append(math.nan)
            return False
        self._running = _SMOOTHING * self._running + (1 - _SMOOTHING) * loss
        self._count += 1
        smoothed = self._running / (1 - _SMOOTHING**self._count)  # bias-corrected
        self.lrs.append(lr)
        self.losses.append(smoothed)
        if not math.isfinite(smoothed):
            return True
        threshold = self.early_stop_threshold
        if threshold is not None and self._count > 1 and smoothed > threshold * self._best:
            return True
        self._best = min(self._best, smoothed)
        return False
