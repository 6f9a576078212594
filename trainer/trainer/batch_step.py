"""One training batch, from ``on_train_batch_start`` to ``on_train_batch_end``: the fit's step path.

`BatchStep` owns what a training batch does: ``training_step`` under autocast, the loss check,
``zero_grad`` on the first batch of an accumulation window (Lightning's place: hooks and
callbacks still see the last step's gradients), backward, and on the window's last batch
``on_before_optimizer_step``, clipping and the optimizer step (inline in `BatchStep.step_batch`
when a fit has nothing to call between them: no hook, override, closure, clipping, anomaly
check, autocast or profiler). A module that overrides ``optimizer_step`` /
``optimizer_zero_grad`` gets them called where Lightning calls them
(`trainer.trainer.step_hooks`); an optimizer whose ``step`` needs a closure (LBFGS) gets one
(`trainer.trainer.closure`). Hooks go through the `HookTable` it is given.

Two users, one path. `trainer.trainer.fit_loop.FitLoop` is a BatchStep over the fit's hook
table; it counts the steps (global step, interval schedulers, logger rows) and owns epochs,
validation and stopping. `trial_step` builds one for the finders' trial steps
(LearningRateFinder, BatchSizeFinder, at ``on_fit_start``): the module's hooks and no
callback's (Lightning swaps ``trainer.callbacks`` out while it searches); nobody counts those
steps, so the Trainer's progress does not move. This module owns neither epochs, nor counting,
nor putting state back after trials (`trainer.callbacks.finder_steps`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError
from trainer.precision import Precision
from trainer.profilers import PassThroughProfiler
from trainer.strategies.ddp_reducer import manual_backward, manual_step_forward
from trainer.trainer.closure import check_closure_precision, needs_closure, stepping_with
from trainer.trainer.hook_table import HookTable, is_overridden
from trainer.trainer.loss import anomaly_backward, check_finite, loss_of
from trainer.trainer.module import TrainModule
from trainer.trainer.options import is_instance_named
from trainer.trainer.profiling import is_profiling
from trainer.trainer.step_hooks import HookedStep

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["BatchStep", "batch_end_outputs", "trial_step"]


class BatchStep:
    """The step of a training batch through ``trainer.accelerator``; built once per ``fit`` (or
    per finder search).

    Args:
        trainer: the running Trainer (its accelerator, optimizers and step options).
        hooks: the hooks to call: the fit's table, or the module's alone for trial steps.
        model: the prepared model; ``accelerator.accumulate`` syncs gradients through it.
        training_step: ``training_step(batch, batch_idx)`` through the prepared model.

    Raises:
        ConfigurationError: a closure optimizer (LBFGS) under a gradient scaler.
    """

    def __init__(
        self,
        trainer: Trainer,
        hooks: HookTable,
        *,
        model: torch.nn.Module,
        training_step: Callable[..., Any],
    ) -> None:
        self.trainer = trainer
        self._hooks = hooks
        self._model = model
        self._training_step = training_step
        module = trainer.module
        is_automatic = module.automatic_optimization
        optimizer = trainer.optimizers[0] if is_automatic and trainer.optimizers else None
        self._needs_closure = optimizer is not None and needs_closure(optimizer)
        if self._needs_closure:
            check_closure_precision(optimizer, trainer.precision_plugin)
        self._has_zero_grad_hook = is_automatic and is_overridden(
            module, "optimizer_zero_grad", TrainModule
        )
        self._has_clip_hook = is_automatic and is_overridden(
            module, "configure_gradient_clipping", TrainModule
        )
        self._module_backward = module_backward(trainer)
        self._hooked_step = (
            HookedStep(
                module,
                optimizer,
                run_batch=self._run_batch,
                before_step=self._before_step,
                is_step_skipped=self._is_step_skipped,
                normalize=trainer.accumulate_grad_batches,
            )
            if optimizer is not None and is_overridden(module, "optimizer_step", TrainModule)
            else None
        )
        # StochasticWeightAveraging's BatchNorm epoch: training_step and the hooks run, but
        # no zero_grad, backward or optimizer step (the step is counted, as Lightning's is).
        self.skip_backward = False
        self._closure_batch: tuple[Any, int] | None = None
        self._closure_loss: torch.Tensor | None = None
        # Read once per fit, not on every batch (the hot path): the hook lists (empty when
        # nobody implements the hook) and whether the module optimizes automatically.
        self._accelerator = trainer.accelerator
        self._gradient_state = trainer.accelerator.gradient_state
        self._is_automatic = is_automatic
        # A true precision's autocast is the base plugin's shared no-op context: not entered.
        self._has_autocast = is_overridden(trainer.accelerator.precision, "autocast", Precision)
        self._on_batch_start = hooks["on_train_batch_start"]
        self._on_batch_end = hooks["on_train_batch_end"]
        # Lightning divides the loss by accumulate_grad_batches before on_before_backward and
        # on_train_batch_end see it (the Accelerator's backward divides it itself).
        self._loss_divisor = trainer.accumulate_grad_batches if is_automatic else 1
        self._on_before_backward = hooks["on_before_backward"]
        self._on_after_backward = hooks["on_after_backward"]
        self._on_before_zero_grad = hooks["on_before_zero_grad"]
        self._on_before_optimizer_step = hooks["on_before_optimizer_step"]
        # The plain step, decided once: nothing to call between training_step, zero_grad,
        # backward and the optimizer step (no hook, module override, closure, autocast or
        # profiler; clipping and detect_anomaly are read per batch). `step_batch` then runs
        # them inline; anything else goes through `_step_automatic`.
        self._is_plain = (
            is_automatic
            and optimizer is not None
            and self._hooked_step is None
            and not self._needs_closure
            and not self._has_zero_grad_hook
            and not self._has_clip_hook
            and self._module_backward is None
            and not self._has_autocast
            and not is_profiling(trainer.profiler)
            and not any(
                hooks[name]
                for name in (
                    "on_before_backward",
                    "on_after_backward",
                    "on_before_zero_grad",
                    "on_before_optimizer_step",
                )
            )
        )

    def start_batch(self, batch: Any, batch_idx: int) -> bool:
        """``on_train_batch_start``; True when the module's returned -1 (skip the rest)."""
        return bool(self._on_batch_start) and (
            self._hooks.call("on_train_batch_start", batch, batch_idx) == -1
        )

    def step_batch(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None, bool]:
        """``training_step`` and what follows it; return ``(output, loss, is_stepping)``.

        ``loss`` is None when ``training_step`` returned None (the batch is skipped).
        ``is_stepping``: the batch ended an accumulation window, so the optimizer stepped (or,
        without a loss, counts as stepped without stepping, as in Lightning).
        Under manual optimization the module steps its optimizers itself; every batch counts
        as stepping and ``loss`` is the output's (a Tensor, or a dict's "loss"), if any.
        """
        if not self._is_automatic:
            with manual_step_forward(self._model):  # each manual_backward syncs (DDP)
                if self._has_autocast:
                    with self._accelerator.autocast():
                        output = self._training_step(batch, batch_idx)
                else:
                    output = self._training_step(batch, batch_idx)
            return output, _loss_in(output), True
        # The Accelerator decides whether this batch ends an accumulation window; what it
        # returns for a batch that needs no context (a nullcontext) is not entered.
        window = self._accelerator.accumulate(self._model)
        if type(window) is not contextlib.nullcontext:
            with window:
                return self._step_automatic(batch, batch_idx)
        trainer = self.trainer
        if (
            not self._is_plain
            or trainer.detect_anomaly
            or trainer.gradient_clip_val
            or self.skip_backward
        ):
            return self._step_automatic(batch, batch_idx)
        # The plain step: `_step_automatic`'s parts in its order, inline (this runs every
        # batch), where none of them would call anything but the next.
        is_stepping = self._gradient_state.sync_gradients
        output = self._training_step(batch, batch_idx)
        if type(output) is torch.Tensor and output.requires_grad and output.numel() == 1:
            loss = output  # passes `loss_of`'s checks
        else:
            loss = loss_of(trainer, output, batch_idx)
        optimizer = trainer.optimizers[0]
        if batch_idx % self._gradient_state.num_steps == 0:  # trainer.accumulate_grad_batches
            optimizer.optimizer.zero_grad()  # `_zero_grad`: the wrapped optimizer's own
        if loss is not None:
            self._accelerator.backward(loss)
            if is_stepping:
                optimizer.step()
        elif is_stepping and self._accelerator.scaler is None:
            optimizer.step()  # Lightning steps on what the window accumulated: `_is_step_skipped`
        return output, loss, is_stepping

    def _step_automatic(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None, bool]:
        """`step_batch` under automatic optimization, inside the batch's accumulation window."""
        is_stepping = self._gradient_state.sync_gradients
        if is_stepping and self._hooked_step is not None:  # the module's optimizer_step
            output, loss = self._hooked_step.run(self.trainer.current_epoch, batch, batch_idx)
        else:
            output, loss = self._run_batch(batch, batch_idx)
            if is_stepping:
                if self._needs_closure:  # LBFGS: the closure's first call: this loss
                    self._closure_batch = (batch, batch_idx)
                    self._closure_loss = None if loss is None else loss.detach()
                self._optimizer_step(self.skip_backward or self._is_step_skipped(loss))
        return output, loss, is_stepping

    def _is_step_skipped(self, loss: torch.Tensor | None) -> bool:
        """Whether a stepping batch's optimizer step is left out: as in Lightning, only when
        ``training_step`` returned None under a gradient scaler; otherwise the optimizer steps
        on what the window accumulated (nothing without accumulation: zero_grad cleared it)."""
        return loss is None and self._accelerator.scaler is not None

    def end_batch(self, output: Any, batch: Any, batch_idx: int) -> None:
        """``on_train_batch_end`` with `batch_end_outputs` of ``training_step``'s output."""
        if self._on_batch_end:  # hot path: build nothing nobody reads
            outputs = batch_end_outputs(output, self._loss_divisor, self._is_automatic)
            self._hooks.call("on_train_batch_end", outputs, batch, batch_idx)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The hooks around ``accelerator.backward`` (also ``manual_backward``'s path)."""
        # Empty hook lists are skipped without a call: this runs every batch.
        if self._on_before_backward:  # the loss backward takes: Lightning's, divided
            divisor = self._loss_divisor
            self._hooks.call("on_before_backward", loss / divisor if divisor > 1 else loss)
        if self._module_backward is not None:  # the precision calls it on the scaled loss
            kwargs["backward_fn"] = self._module_backward
        if self.trainer.detect_anomaly:
            anomaly_backward(self.trainer, loss, **kwargs)
        else:
            self._accelerator.backward(loss, **kwargs)
        if self._on_after_backward:
            self._hooks.call("on_after_backward")

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``TrainModule.manual_backward``: the same hooks and path as automatic backward."""
        if self.trainer.detect_anomaly:
            check_finite(loss, "training_step (manual_backward)")
        with manual_backward(self._model, loss):
            self.backward(loss, **kwargs)

    def _run_batch(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """``training_step``, then (Lightning's order) ``zero_grad`` on the first batch of a
        window, so hooks and callbacks still see the last step's gradients, then backward."""
        trainer = self.trainer
        if self._has_autocast:
            with self._accelerator.autocast():
                output = self._training_step(batch, batch_idx)
        else:
            output = self._training_step(batch, batch_idx)
        loss = loss_of(trainer, output, batch_idx)
        if self.skip_backward:  # Lightning: neither zero_grad nor backward
            return output, loss
        if batch_idx % trainer.accumulate_grad_batches == 0:
            self._zero_grad(batch_idx)
        if loss is not None:
            self.backward(loss)
        return output, loss

    def _zero_grad(self, batch_idx: int) -> None:
        """``on_before_zero_grad``, then clear the gradients (first batch of each window)."""
        trainer = self.trainer
        optimizer = trainer.optimizers[0]
        if self._on_before_zero_grad:
            self._hooks.call("on_before_zero_grad", optimizer)
        # The wrapped optimizer's own zero_grad: the prepared one's is a no-op inside a window
        # (Lightning, too, hands the module's optimizer_zero_grad the torch optimizer).
        if self._has_zero_grad_hook:
            trainer.module.optimizer_zero_grad(
                trainer.current_epoch, batch_idx, optimizer.optimizer
            )
        else:
            optimizer.optimizer.zero_grad()

    def _optimizer_step(self, is_skipped: bool = False) -> None:
        """Unscale, hook, clip, step.

        ``is_skipped`` (`_is_step_skipped`, or StochasticWeightAveraging's BatchNorm epoch):
        as in Lightning, the hook runs (and the fit counts the step), but the optimizer does not
        step.
        """
        trainer = self.trainer
        optimizer = trainer.optimizers[0]
        if self._on_before_optimizer_step or self._has_clip_hook or trainer.gradient_clip_val:
            self._before_step(is_skipped)
        if not is_skipped:
            if self._needs_closure:
                with stepping_with(optimizer, self._closure):
                    optimizer.step()
            else:
                optimizer.step()

    def _before_step(self, is_skipped: bool) -> None:
        """``on_before_optimizer_step`` (on unscaled gradients), then clipping: the module's
        ``configure_gradient_clipping`` (called for a skipped step too, as in Lightning), else
        the Trainer's ``gradient_clip_val``."""
        trainer = self.trainer
        accelerator = self._accelerator
        if self._on_before_optimizer_step or self._has_clip_hook:
            if not is_skipped:
                accelerator.unscale_gradients()  # hooks see true gradients
        if self._on_before_optimizer_step:
            self._hooks.call("on_before_optimizer_step", trainer.optimizers[0])
        if self._has_clip_hook:
            trainer.module.configure_gradient_clipping(
                trainer.optimizers[0], trainer.gradient_clip_val, trainer.gradient_clip_algorithm
            )
        elif not is_skipped and trainer.gradient_clip_val:
            parameters = trainer.module.parameters()
            if trainer.gradient_clip_algorithm == "norm":
                accelerator.clip_grad_norm_(parameters, trainer.gradient_clip_val)
            else:
                accelerator.clip_grad_value_(parameters, trainer.gradient_clip_val)

    def _closure(self) -> torch.Tensor | None:
        """LBFGS' closure. The first call returns the batch's loss, computed already; each later
        call evaluates the batch again as Lightning's closure does: ``training_step``,
        ``zero_grad`` (first batch of a window), backward, ``on_before_optimizer_step``, clip."""
        if self._closure_loss is not None:
            loss, self._closure_loss = self._closure_loss, None
            return loss
        _, loss = self._run_batch(*self._closure_batch)
        self._before_step(is_skipped=loss is None)
        return None if loss is None else loss.detach()


def module_backward(trainer: Trainer) -> Callable[..., None] | None:
    """The module's ``backward`` override (Lightning's hook), or None: not overridden, or under
    DeepSpeed, whose engine runs the backward itself (a warning, as Lightning gives)."""
    module = trainer.module
    if not is_overridden(module, "backward", TrainModule):
        return None
    if is_instance_named(trainer.strategy, "DeepSpeedStrategy"):
        warn_user(
            f"{type(module).__name__}.backward is not called under DeepSpeed: its engine runs "
            "the backward pass (as in Lightning)."
        )
        return None
    return module.backward


def trial_step(trainer: Trainer) -> BatchStep:
    """The fit's step path for a finder's trial steps, from ``on_fit_start`` on.

    The module's hooks run as in fit; no callback's does (Lightning runs its searches with
    ``trainer.callbacks`` swapped out). Nobody counts the steps: ``global_step``, the
    schedulers and the loggers do not move; a profiler does not time them.

    Raises:
        ConfigurationError: the fit has not prepared its model yet (called before
            ``on_fit_start``).
    """
    module, model = trainer.module, trainer.model
    if module is None or model is None:
        raise ConfigurationError(
            "the finders' trial steps need the fit's prepared model and optimizers; run them "
            "from on_fit_start or later."
        )
    hooks = HookTable(trainer, module, (), PassThroughProfiler())  # trials are not the fit's
    return BatchStep(trainer, hooks, model=model, training_step=partial(model, "training_step"))


def batch_end_outputs(output: Any, divisor: int, is_automatic: bool) -> dict[str, Any]:
    """What ``on_train_batch_end`` receives, as Lightning builds it: ``{"loss": loss}``
    detached, divided by ``accumulate_grad_batches`` under automatic optimization (``divisor``)
    and followed by a dict's other keys; ``{}`` for None. Manual optimization: a dict's copy
    (its "loss" detached), a Tensor as ``{"loss": t.detach()}``."""
    if isinstance(output, torch.Tensor):
        return {"loss": (output / divisor if divisor > 1 else output).detach()}
    if not isinstance(output, dict):
        return {}  # None: training_step checked anything else already
    loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        loss = (loss / divisor if divisor > 1 else loss).detach()
    if is_automatic:
        return {"loss": loss, **{key: v for key, v in output.items() if key != "loss"}}
    return {**output, "loss": loss} if "loss" in output else dict(output)


def _loss_in(output: Any) -> torch.Tensor | None:
    """The loss a manual-optimization ``training_step`` returned, if any (not checked: the
    module did its own backward)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    return None
