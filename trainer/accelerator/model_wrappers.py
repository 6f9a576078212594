"""What preparing a model wraps its forward in, besides the engine: autocast, float32 outputs.

`AutocastForward` runs a model's forward under the precision plugin's autocast (mixed modes)
and, as Accelerate's ``convert_outputs_to_fp32``, returns its float16 / bfloat16 tensors as
float32, so a loss computed from them outside autocast is computed in float32. It is kept as an
object so ``unwrap_model(keep_fp32_wrapper=False)`` can take both off again. The Trainer's
`StepRouter` (whose forward returns what ``training_step`` returned) keeps its outputs as they
are, as Lightning's mixed precision does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.accelerator.collectives import map_tensors
from trainer.precision import Precision

__all__ = ["AutocastForward"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)


class AutocastForward:
    """A model's forward run under the precision plugin's autocast, its half-precision outputs
    returned as float32 (kept unwrappable)."""

    def __init__(self, original: Callable[..., Any], precision: Precision) -> None:
        self.original = original
        self.precision = precision
        self.is_converting_outputs = not _routes_steps(original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            outputs = self.original(*args, **kwargs)
        return map_tensors(_to_float32, outputs) if self.is_converting_outputs else outputs


def _to_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in _HALF_DTYPES else tensor


def _routes_steps(forward: Callable[..., Any]) -> bool:
    """Whether ``forward`` is the Trainer's StepRouter's, maybe inside engine wrappers (which
    keep the model as ``.module``): its outputs are step results, which Lightning leaves as they are."""
    module = getattr(forward, "__self__", None)
    while isinstance(module, torch.nn.Module):
        if getattr(module, "routes_steps_to_module", False):
            return True
        module = getattr(module, "module", None)
    return False
