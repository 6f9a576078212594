"""Manual optimization's ``optimizer.step()``, as Lightning's ``LightningOptimizer.step``.

Under ``automatic_optimization = False`` the module steps the optimizers ``self.optimizers()``
hands out. In Lightning that step runs ``on_before_optimizer_step`` (callbacks, then the module)
and takes an optional closure, which it runs first (an optimizer such as LBFGS runs it again for
each evaluation, each time followed by the hook). For one ``fit`` the loop binds that behaviour on
each prepared optimizer (`bind_manual_steps`), so ``self.optimizers()`` stays the very objects
``trainer.optimizers`` holds; the binding is removed when the fit ends.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigurationError, describe
from trainer.trainer.closure import needs_closure, stepping_with

if TYPE_CHECKING:
    from trainer.trainer.hook_table import HookTable
    from trainer.trainer.run import Progress

__all__ = ["bind_manual_steps"]


def bind_manual_steps(
    optimizers: list[Any], hooks: HookTable, progress: Progress
) -> Callable[[], None]:
    """Make each prepared optimizer's ``step(closure=None)`` Lightning's; return the undo.

    Each step taken counts one ``progress.global_step`` as it returns (so ``self.global_step``
    inside ``training_step`` is current after each, as in Lightning); one the ``16-mixed``
    grad scaler skipped does not count (docs/precision.md).
    """
    for optimizer in optimizers:
        optimizer.step = partial(_step, optimizer, hooks, progress)

    def unbind() -> None:
        for optimizer in optimizers:
            optimizer.__dict__.pop("step", None)

    return unbind


def _step(
    optimizer: Any,
    hooks: HookTable,
    progress: Progress,
    closure: Callable[[], Any] | None = None,
) -> Any:
    """Run ``closure`` (if any) and ``on_before_optimizer_step``, then step; return what the
    closure returned first."""
    if closure is not None and not callable(closure):
        raise ConfigurationError(
            f"optimizer.step(closure={describe(closure)}): the closure must be callable, e.g. a "
            "function that computes the loss and calls self.manual_backward(loss)."
        )
    results: list[Any] = []

    def run_closure() -> Any:
        result = closure() if closure is not None else None
        if hooks["on_before_optimizer_step"]:
            hooks.call("on_before_optimizer_step", optimizer)
        results.append(result)
        return result

    prepared_step = type(optimizer).step  # the class's: through the strategy and precision
    steps_before = optimizer.step_count
    if closure is not None or needs_closure(optimizer):
        with stepping_with(optimizer, run_closure):  # the optimizer calls it (LBFGS: often)
            prepared_step(optimizer)
    else:
        run_closure()
        prepared_step(optimizer)
    if not results:  # the prepared optimizer did not step (it never does while accumulating)
        run_closure()
    progress.global_step += optimizer.step_count - steps_before
    return results[0]
