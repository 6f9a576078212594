"""What preparing a model wraps its forward in, besides the engine: autocast, float32 outputs.
And `extract_model_from_parallel`, which takes a model out of every wrapper (Accelerate's).

`AutocastForward` runs a model's forward under the precision plugin's autocast (mixed modes)
and, as Accelerate's ``convert_outputs_to_fp32``, returns its float16 / bfloat16 tensors as
float32, so a loss computed from them outside autocast is computed in float32. It is kept as an
object so ``unwrap_model(keep_fp32_wrapper=False)`` can take both off again. The Trainer's
`StepRouter` (whose forward returns what ``training_step`` returned) keeps its outputs as they
are, as Lightning's mixed precision does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from trainer.accelerator.collectives import map_tensors
from trainer.errors import ConfigurationError
from trainer.precision import Precision

__all__ = ["AutocastForward", "extract_model_from_parallel", "remove_autocast_forward"]

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


def remove_autocast_forward(module: torch.nn.Module) -> None:
    """Give ``module`` back the forward it had before `AutocastForward` wrapped it (if it did)."""
    if isinstance(module.forward, AutocastForward):
        module.forward = module.forward.original


def _containers() -> tuple[type, ...]:
    """The wrappers that hold the user's model as ``.module``: torch's data parallel ones, the
    DeepSpeed strategy's, and DeepSpeed's engine when deepspeed is imported (not imported here)."""
    from trainer.strategies.deepspeed_engine import DeepSpeedModel

    found: tuple[type, ...] = (
        torch.nn.parallel.DistributedDataParallel,
        torch.nn.DataParallel,
        DeepSpeedModel,
    )
    deepspeed = sys.modules.get("deepspeed")
    engine = getattr(deepspeed, "DeepSpeedEngine", None) if deepspeed is not None else None
    return (*found, engine) if isinstance(engine, type) else found


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The model inside DDP, DataParallel, DeepSpeed and ``torch.compile`` wrappers
    (Accelerate's ``accelerate.utils.extract_model_from_parallel``).

    FSDP2 and Megatron change the model in place, so it is its own inside. An Accelerator's
    ``unwrap_model`` does the same with the engine it prepared.

    Args:
        model: the prepared (or any) model.
        keep_fp32_wrapper: False takes mixed precision's autocast off the model's forward.
        keep_torch_compile: return the compiled wrapper when the model was compiled.
        recursive: also replace every wrapper found among the submodules by what it holds.

    Raises:
        ConfigurationError: ``keep_torch_compile=True`` where a wrapper (DDP, ...) sits between
            the compiled wrapper and the model, so no compiled wrapper of the model exists.
    """
    containers = _containers()
    compiled = model if isinstance(getattr(model, "_orig_mod", None), torch.nn.Module) else None
    module = model._orig_mod if compiled is not None else model  # noqa: SLF001 - torch.compile's
    if not keep_fp32_wrapper:
        remove_autocast_forward(module)
    while isinstance(module, containers):
        module = module.module
        if not keep_fp32_wrapper:
            remove_autocast_forward(module)
    if recursive:
        _unwrap_children(module, containers)
    if compiled is None or not keep_torch_compile:
        return module
    if compiled._orig_mod is not module:  # noqa: SLF001
        raise ConfigurationError(
            "extract_model_from_parallel(keep_torch_compile=True): the compiled model wraps "
            f"{type(compiled._orig_mod).__name__}, not your {type(module).__name__}, so no "  # noqa: SLF001
            "compiled wrapper of your model exists. Pass keep_torch_compile=False."
        )
    return compiled


def _unwrap_children(module: torch.nn.Module, containers: tuple[type, ...]) -> None:
    for name, child in list(module.named_children()):
        inner = child
        while isinstance(inner, containers):
            inner = inner.module
        if inner is not child:
            setattr(module, name, inner)
        _unwrap_children(inner, containers)
