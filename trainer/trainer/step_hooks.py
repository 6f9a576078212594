"""The TrainModule's ``optimizer_step`` hook under automatic optimization, when a module overrides it.

Lightning calls ``optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)`` on each batch
that steps (the last of an accumulation window), before anything else of the batch after
``on_train_batch_start``: the closure runs ``training_step``, ``zero_grad`` (first batch of a
window) and backward, and ``optimizer.step(closure=optimizer_closure)`` runs the closure, then
``on_before_optimizer_step`` and gradient clipping, then the step. A module that overrides the
hook (a learning-rate warm-up before the step, a step taken only every other batch) gets exactly
that, from `HookedStep`. A module that does not never meets a closure: the batch step runs
``training_step``, the backward and the optimizer step itself (`trainer.trainer.batch_step`).

This module owns the closure and the optimizer's ``step(closure)`` inside the hook; the batch
step owns what the closure runs (``run_batch``) and the hooks around the step (``before_step``),
and its user (the fit loop, or a finder's trial) the counting of the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe
from trainer.trainer.closure import needs_closure, stepping_with

__all__ = ["HookedStep", "TrainingClosure"]

# (batch, batch_idx) -> (training_step's output, its loss or None); runs zero_grad and backward.
RunBatch = Callable[[Any, int], tuple[Any, torch.Tensor | None]]


class TrainingClosure:
    """``optimizer_closure``: each call runs the batch's ``training_step``, ``zero_grad`` (on the
    first batch of a window) and backward, and returns the loss, detached and divided by
    ``accumulate_grad_batches`` (Lightning's), or None when ``training_step`` returned None."""

    def __init__(self, run_batch: RunBatch, batch: Any, batch_idx: int, normalize: int) -> None:
        self._run_batch = run_batch
        self._batch = batch
        self._batch_idx = batch_idx
        self._normalize = normalize
        self.has_run = False
        self.output: Any = None  # training_step's output of the last call
        self.loss: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor | None:
        with torch.enable_grad():  # an optimizer may call it under no_grad (LBFGS does not)
            self.output, self.loss = self._run_batch(self._batch, self._batch_idx)
        self.has_run = True
        if self.loss is None:
            return None
        loss = self.loss.detach()
        return loss / self._normalize if self._normalize > 1 else loss.clone()


class HookedStep:
    """Runs a stepping batch through ``module.optimizer_step``; for one ``fit``.

    During the hook the prepared optimizer's ``step(closure=None)`` is Lightning's: it runs the
    closure, then ``before_step(is_skipped)`` (``on_before_optimizer_step``,
    unscaling, clipping), then the step through the strategy, which is left out when
    ``is_step_skipped(loss)`` (``training_step`` returned None under a gradient scaler, as in
    Lightning: otherwise the step takes what the window accumulated); an optimizer such as LBFGS calls the closure, and
    ``before_step`` after it, for each evaluation.
    """

    def __init__(
        self,
        module: Any,
        optimizer: Any,
        *,
        run_batch: RunBatch,
        before_step: Callable[[bool], None],
        is_step_skipped: Callable[[torch.Tensor | None], bool],
        normalize: int,
    ) -> None:
        self._module = module
        self._optimizer = optimizer
        self._run_batch = run_batch
        self._before_step = before_step
        self._is_step_skipped = is_step_skipped
        self._normalize = normalize
        self._closure: TrainingClosure | None = None  # the current batch's

    def run(self, epoch: int, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """Call ``module.optimizer_step`` for this stepping batch.

        Returns:
            ``training_step``'s output and its loss (None when it returned None) of the
            closure's last call.

        Raises:
            ConfigurationError: the hook returned without running the closure, so the batch
                was never trained on (Lightning raises too).
        """
        closure = TrainingClosure(self._run_batch, batch, batch_idx, self._normalize)
        optimizer = self._optimizer
        self._closure = closure
        optimizer.step = self.step  # Lightning's step(closure), for the hook's call only
        try:
            self._module.optimizer_step(epoch, batch_idx, optimizer, closure)
        finally:
            optimizer.__dict__.pop("step", None)
            self._closure = None
        if not closure.has_run:
            name = f"{type(self._module).__name__}.optimizer_step"
            raise ConfigurationError(
                f"{name} returned without running optimizer_closure (epoch {epoch}, batch "
                f"{batch_idx}), so training_step and backward never ran. Call "
                "optimizer.step(closure=optimizer_closure), or optimizer_closure() to skip the "
                "step but still train on the batch."
            )
        return closure.output, closure.loss

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The prepared optimizer's step inside ``optimizer_step``: closure, hooks, step."""
        if closure is not None and not callable(closure):
            raise ConfigurationError(
                f"optimizer.step(closure={describe(closure)}) in optimizer_step: the closure must "
                "be callable; pass the optimizer_closure the hook received."
            )
        optimizer = self._optimizer
        results: list[Any] = []

        def run_closure() -> Any:
            result = closure() if closure is not None else None
            self._before_step(self._is_skipped())
            results.append(result)
            return result

        prepared_step = type(optimizer).step  # the class's: through the strategy and precision
        if needs_closure(optimizer):  # LBFGS: it calls the closure for each evaluation
            with stepping_with(optimizer, run_closure):
                prepared_step(optimizer)
        else:
            run_closure()
            if not self._is_skipped():
                prepared_step(optimizer)
        return results[0] if results else None

    def _is_skipped(self) -> bool:
        """Whether the step is left out: the closure never ran, or ``is_step_skipped`` says so
        for its loss (None under a gradient scaler, as in Lightning)."""
        return self._closure is None or self._is_step_skipped(self._closure.loss)
