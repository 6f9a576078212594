"""LearningRateFinder: the learning-rate range test at the start of fit, its suggestion and plot.

This module owns the range test (the learning rate of each step, the smoothing and early stop),
the suggestion and the plot. It does not own the loop: the test's steps go through the fit's own
batch step (`trainer.callbacks.finder_steps.run_training_steps`), where the module's hooks run
and no callback's, and `trainer.callbacks.finder_steps.TrainingState` puts the module,
optimizer, precision and RNG state back as they were; the Trainer's progress (global step,
epoch) does not move.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch

from trainer._imports import require
from trainer.callbacks.arguments import bad_argument, is_int, is_number
from trainer.callbacks.callback import Callback
from trainer.callbacks.finder_steps import TrainingState, run_training_steps, train_loader
from trainer.errors import ConfigurationError

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["LearningRateFinder"]

_MODES = ("exponential", "linear")
_SMOOTHING = 0.98  # weight of the running mean of the loss (Lightning's beta)


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
    its schedulers' ``base_lrs``, so the fit trains with it. The test's steps are the fit's
    (accumulation, clipping, precision, the module's ``optimizer_step`` if overridden) and run
    the module's batch hooks but no callback's, as in Lightning.

    Args:
        min_lr: the first learning rate of the test.
        max_lr: the last learning rate of the test.
        num_training_steps: optimizer steps of the test (the loader is cycled when shorter).
        mode: "exponential" or "linear" growth of the learning rate.
        early_stop_threshold: stop when the smoothed loss exceeds this times the best; None
            never stops early.
        update_attr: write the suggestion to the module and the optimizer.
        attr_name: the module attribute or ``hparams`` key that holds the learning rate;
            "" (Lightning's default) takes ``lr``, else ``learning_rate``, whichever the module
            (or its DataModule) has.

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
        attr_name: str = "",
    ) -> None:
        for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
            if not is_number(value) or value <= 0:
                raise bad_argument("LearningRateFinder", name, value, "a float > 0")
        if not min_lr < max_lr:
            raise bad_argument(
                "LearningRateFinder", "min_lr", min_lr, f"a value below max_lr={max_lr}"
            )
        if not is_int(num_training_steps) or num_training_steps < 2:
            steps = num_training_steps
            raise bad_argument(
                "LearningRateFinder", "num_training_steps", steps, "an int >= 2, e.g. 100"
            )
        if mode not in _MODES:
            raise bad_argument("LearningRateFinder", "mode", mode, "'exponential' or 'linear'")
        threshold = early_stop_threshold
        if threshold is not None and (not is_number(threshold) or threshold <= 0):
            raise bad_argument(
                "LearningRateFinder", "early_stop_threshold", threshold, "a float > 0 or None"
            )
        if not isinstance(attr_name, str):
            raise bad_argument("LearningRateFinder", "attr_name", attr_name, "a name such as 'lr'")
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
        loader = train_loader(trainer)
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

        state = TrainingState.capture(trainer, module)
        try:
            run_training_steps(
                trainer, loader, self.num_training_steps, before_step=set_lr, after_step=record
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
        """The learning rate of each step of the test, as Lightning 2.6's schedules give them.

        Step 0 runs at ``min_lr``; step ``i >= 1`` at the fraction ``(i + 1) / n`` of the way to
        ``max_lr`` (geometric in exponential mode), so the last one is ``max_lr`` and the second
        one is two fractions up (Lightning's schedulers step from their second value on).
        """
        n = self.num_training_steps
        low, high = self.min_lr, self.max_lr
        fractions = [0.0] + [(i + 1) / n for i in range(1, n)]
        if self.mode == "exponential":
            return [low * (high / low) ** f for f in fractions]
        return [low + (high - low) * f for f in fractions]

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss falls fastest (Lightning 2.6's method).

        The loss curve without its first ``skip_begin`` and last ``skip_end`` points and without
        non-finite losses is differentiated with ``torch.gradient`` against the learning rate
        itself (in both modes, as Lightning 2.6; Lightning 1.x used the index, which on an
        exponential schedule is log10(lr)); the steepest negative slope wins. None when fewer
        than two points remain.
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
        gradients = torch.gradient(losses, spacing=[lrs])[0]
        return int(positions[torch.argmin(gradients)])

    # ---- applying the suggestion ---------------------------------------------------------
    def _check_attr(self, module: TrainModule) -> None:
        if not self.attr_name:
            lr_attribute(module, module.trainer.datamodule, required=True)
            return
        if not (hasattr(module, self.attr_name) or self.attr_name in module.hparams):
            raise ConfigurationError(
                f"LearningRateFinder(attr_name={self.attr_name!r}): {type(module).__name__} has "
                f"no attribute or hparams entry {self.attr_name!r} to update. Store the learning "
                "rate there (self.save_hyperparameters() with an `lr` argument), pass the right "
                "attr_name, or set update_attr=False."
            )

    def _set_attr(self, module: TrainModule, lr: float) -> None:
        name = self.attr_name or lr_attribute(module, module.trainer.datamodule, required=False)
        if name in module.hparams:
            module.hparams[name] = lr
        if hasattr(module, name):
            setattr(module, name, lr)

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
        # Lightning's bias correction reads the global step after the optimizer stepped (one
        # more than the steps recorded): its first smoothed loss is loss / (1 + beta).
        smoothed = self._running / (1 - _SMOOTHING ** (self._count + 1))
        self.lrs.append(lr)
        self.losses.append(smoothed)
        if not math.isfinite(smoothed):
            return True
        threshold = self.early_stop_threshold
        if threshold is not None and self._count > 1 and smoothed > threshold * self._best:
            return True
        self._best = min(self._best, smoothed)
        return False


def lr_attribute(module: TrainModule, datamodule: Any, *, required: bool) -> str:
    """``lr`` or ``learning_rate``: the first the module (its hparams) or DataModule has
    (Lightning's search for ``attr_name=""``); "lr" when neither has one.

    Raises:
        ConfigurationError: neither has one and ``required``.
    """
    for name in ("lr", "learning_rate"):
        for holder in (module, datamodule):
            if holder is not None and (
                hasattr(holder, name) or name in getattr(holder, "hparams", {})
            ):
                return name
    if required:
        raise ConfigurationError(
            f"learning-rate finder: {type(module).__name__} has no `lr` or `learning_rate` "
            "attribute or hparams entry to update. Add one, pass attr_name=..., or "
            "update_attr=False."
        )
    return "lr"
