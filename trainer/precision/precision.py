"""The Precision base class: full 32-bit precision, and the interface every mode implements.

A Precision plugin owns how numbers are represented: the dtype of parameters and inputs, the
autocast region, loss scaling and the optimizer step that scaling changes. It knows nothing of
strategies; a strategy asks it for dtypes and calls its verbs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Precision"]

_NO_AUTOCAST = contextlib.nullcontext()  # reusable: entering it has no state


class Precision:
    """Full precision: parameters and math in ``float32``, no autocast, no loss scaling.

    Subclasses override only what their mode changes.
    """

    name: str = "32-true"
    mixed_precision: str = "no"  # Accelerate's name for the mode
    param_dtype: torch.dtype | None = None  # dtype parameters are converted to (None: untouched)
    compute_dtype: torch.dtype = torch.float32

    def setup(self, device: torch.device) -> None:
        """Bind the plugin to the device it will run on (scalers and autocast need its type)."""
        self.device_type = device.type

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert the module's parameters to this mode's storage dtype."""
        if self.param_dtype is not None:
            module = module.to(dtype=self.param_dtype)
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors of a batch where the mode stores inputs in another dtype."""
        if self.param_dtype is None:
            return data
        return cast_floating(data, self.param_dtype)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The region where the forward pass runs (autocast for mixed modes)."""
        return _NO_AUTOCAST

    def backward(
        self,
        loss: torch.Tensor,
        backward_fn: Callable[..., None] | None = None,
        **kwargs: Any,
    ) -> None:
        """Backpropagate ``loss`` (scaled first where the mode scales) with
        ``backward_fn(loss, **kwargs)``: ``loss.backward`` unless given (the Trainer passes a
        TrainModule's ``backward`` override)."""
        (backward_fn or torch.Tensor.backward)(loss, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping (no-op without scaling)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer``; return False when the step was skipped (inf/NaN under scaling)."""
        optimizer.step()
        return True

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (the grad scaler's, for 16-mixed)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """``data`` with its floating-point tensors cast to ``dtype`` (dicts, lists, tuples walked)."""
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if isinstance(data, dict):
        return {k: cast_floating(v, dtype) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(cast_floating(v, dtype) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(cast_floating(v, dtype) for v in data)
    return data
