"""``Trainer.init_module()``: build a module where and how the Trainer will run it.

Inside the block, new tensors are made on the Trainer's device, in the precision's parameter
dtype (bfloat16 under ``"bf16-true"``, float64 under ``"64-true"``; torch's default otherwise),
so a large model is never built in float32 on the CPU first. ``empty_init=True`` skips the
``torch.nn.init`` functions (the memory is left as allocated: load weights into it next); on a
strategy that builds layers on the meta device for its ranks (FSDP's ``cpu_ram_efficient_loading``)
its own context applies too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from trainer.precision.modes import default_dtype

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["SkipInit", "init_module_context"]


class SkipInit(TorchFunctionMode):
    """While active, every ``torch.nn.init`` function returns its tensor untouched."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def init_module_context(trainer: Trainer, empty_init: bool | None = None) -> Iterator[None]:
    """What ``trainer.init_module(empty_init)`` enters (see the module docstring)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.device(trainer.accelerator.device))
        dtype = trainer.precision_plugin.param_dtype
        if dtype is not None:
            stack.enter_context(default_dtype(dtype))
        if empty_init:
            stack.enter_context(SkipInit())
            stack.enter_context(trainer.strategy.module_init_context())
        yield
