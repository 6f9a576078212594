"""Prepared optimizers and schedulers: the step goes through the strategy and honours accumulation.

`AcceleratedOptimizer` steps (and zeroes gradients) only on batches where gradients are
synchronised, and records whether the precision plugin skipped the step. `AcceleratedScheduler`
follows Accelerate: it steps with the optimizer, never after a skipped step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError
from trainer.precision import Precision
from trainer.strategies import Strategy

if TYPE_CHECKING:
    from trainer.runtime.gradient_state import GradientState

__all__ = [
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "parameter_replacements",
    "use_replaced_parameters",
    "warn_on_eps_below_dtype",
]


_STEP, _PLAIN_STEP = Strategy.optimizer_step, Precision.optimizer_step  # the base ones

# Wrappers that insert a segment into parameter names without changing what they name.
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _plain_name(name: str) -> str:
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def parameter_replacements(
    before: dict[str, torch.nn.Parameter], after: torch.nn.Module
) -> dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """``id(old) -> (old, new)`` for each parameter of ``before`` that ``after`` replaced.

    FSDP2's ``fully_shard`` and tensor parallelism swap a module's parameters for new (DTensor)
    ones, so an optimizer built earlier would step tensors the model no longer uses. Names are
    matched with wrapper segments (activation checkpointing, ``torch.compile``) removed.
    """
    old_by_name = {_plain_name(name): param for name, param in before.items()}
    replaced = {}
    for name, new in after.named_parameters():
        old = old_by_name.get(_plain_name(name))
        if old is not None and old is not new:
            replaced[id(old)] = (old, new)
    return replaced


def use_replaced_parameters(
    optimizer: torch.optim.Optimizer,
    replaced: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]],
) -> None:
    """Point ``optimizer``'s parameter groups (and any state) at the replacing parameters."""
    if not replaced:
        return
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(id(p), (p, p))[1] for p in group["params"]]
    for old, new in replaced.values():
        if old in optimizer.state:
            optimizer.state[new] = optimizer.state.pop(old)


def place_state_with_parameters(optimizer: torch.optim.Optimizer) -> None:
    """Move state tensors that sit on another device than their parameter to the parameter's
    (torch's ``load_state_dict`` rules: Adam's ``step`` stays where torch keeps it)."""
    misplaced = any(
        isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != param.device
        for param, state in optimizer.state.items()
        for value in state.values()
    )
    if misplaced:
        optimizer.load_state_dict(optimizer.state_dict())


def warn_on_eps_below_dtype(optimizer: torch.optim.Optimizer, dtype: torch.dtype | None) -> None:
    """Warn when a group's ``eps`` rounds to 0 in ``dtype`` (the parameters' dtype).

    With float16 parameters (``precision="16-true"``) Adam keeps its moments in float16, where
    the default ``eps=1e-8`` is 0: once ``sqrt(v)`` underflows the update divides by zero.
    """
    if dtype is None or not dtype.is_floating_point:
        return
    for index, group in enumerate(optimizer.param_groups):
        eps = group.get("eps")
        if isinstance(eps, float) and 0 < eps and torch.tensor(eps, dtype=dtype).item() == 0:
            warn_user(
                f"{type(optimizer).__name__} param group {index} has eps={eps:g}, which is 0 in "
                f"{dtype} (the parameters' dtype under this precision): its update can divide "
                "by zero and the loss turn NaN. Use eps=1e-4 or larger, or a mixed precision "
                '("16-mixed" keeps float32 parameters).'
            )


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer so ``step`` and ``zero_grad`` follow accumulation and precision.

    It is an ``Optimizer`` (schedulers accept it) that delegates everything to ``optimizer``.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, strategy: Strategy, gradient_state: GradientState
    ) -> None:
        # Deliberately not calling Optimizer.__init__: all state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self._strategy = strategy
        self._gradient_state = gradient_state
        self.step_was_skipped = False
        self.step_count = 0  # optimizer steps actually taken

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self._strategy.optimizer_state_dict(self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._strategy.load_optimizer_state_dict(self.optimizer, state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients, except inside an accumulation window (they are still adding up)."""
        if self._gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        """Step through the strategy on synchronising batches; a no-op while accumulating."""
        if closure is not None:
            raise ConfigurationError(
                "optimizer.step(closure) is not supported by a prepared optimizer: compute the "
                "loss, call accelerator.backward(loss), then optimizer.step()."
            )
        if not self._gradient_state.sync_gradients:
            return
        strategy = self._strategy
        precision = strategy.precision
        # Every batch: where neither the strategy nor its precision plugin changes the base
        # step, do what they would (step, never skipped) without their two calls.
        if type(strategy).optimizer_step is _STEP and type(precision).optimizer_step is _PLAIN_STEP:
            self.optimizer.step()
            self.step_was_skipped = False
        else:
            self.step_was_skipped = not strategy.optimizer_step(self.optimizer)
        if not self.step_was_skipped:
            self.step_count += 1

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class AcceleratedScheduler:
    """Wraps a learning-rate scheduler so it steps with its optimizer.

    With ``step_with_optimizer=True`` (Accelerate's default) a call to ``step()`` does nothing while
    accumulating or after a skipped optimizer step; with several processes and
    ``split_batches=False`` it advances once per process, so the schedule counts samples as a
    one-process run would.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        gradient_state: GradientState,
        *,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_processes: int = 1,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._gradient_state = gradient_state
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        # Accelerate 1.15 never runs its `adjust_scheduler` count here (the plugin's default
        # never reaches GradientState), and counting would cut OneCycleLR's schedule short.
        if not self._gradient_state.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else self.num_processes
        for _ in range(repeats):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR refuses extra steps
            if total is None or self.scheduler._step_count <= total:  # noqa: SLF001 - as above
                self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
