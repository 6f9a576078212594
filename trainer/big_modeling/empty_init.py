"""Building modules without memory: parameters (and buffers) created on the meta device or any device.

Owns ``init_on_device`` and ``init_empty_weights`` (Accelerate's call shapes), and skipping the
in-place init ops that would run on meta tensors while modules are built.

Does not own placing or loading weights afterwards (``trainer.big_modeling.dispatch``,
``trainer.big_modeling.loading``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["init_empty_weights", "init_on_device"]


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = False) -> Iterator[None]:
    """Create every parameter (and buffer, if asked) of modules built inside on ``device``.

    Without ``include_buffers`` a parameter is created where its module asks (allocated, never
    touched) and moved as it is registered, so buffers keep their computed values; one tensor
    larger than the machine's RAM cannot be allocated even so. With ``include_buffers`` every
    tensor is created on ``device`` from the start (a ``torch.device`` context): any size.

    Examples:
        >>> with init_on_device("meta", include_buffers=True):
        ...     layer = torch.nn.Linear(100_000, 100_000)  # 10B parameters (40 GB), no memory
        >>> layer.weight.device
        device(type='meta')
    """
    device = torch.device(device)
    original_parameter = torch.nn.Module.register_parameter
    original_buffer = torch.nn.Module.register_buffer

    def register_parameter(
        module: torch.nn.Module, name: str, param: torch.nn.Parameter | None
    ) -> None:
        original_parameter(module, name, param)
        if param is not None and param.device != device:  # one already there may be tied: keep it
            # Replaced in nn.Module's own dict: this is the patched registration.
            parameters = module._parameters  # noqa: SLF001
            kwargs = {
                k: v for k, v in parameters[name].__dict__.items() if k != "_is_hf_initialized"
            }
            parameters[name] = type(param)(
                parameters[name].to(device), requires_grad=param.requires_grad, **kwargs
            )

    def register_buffer(
        module: torch.nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        original_buffer(module, name, tensor, persistent=persistent)
        if tensor is not None:
            buffers = module._buffers  # noqa: SLF001 - as for parameters above
            buffers[name] = buffers[name].to(device)

    torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    if include_buffers:
        torch.nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]
    try:
        with (
            torch.device(device) if include_buffers else contextlib.nullcontext(),
            _SkipMetaInit() if device.type == "meta" else contextlib.nullcontext(),
        ):
            yield
    finally:
        torch.nn.Module.register_parameter = original_parameter  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = original_buffer  # type: ignore[method-assign]


# In-place ops that only change values (never shape, dtype or flags), and torch.nn.init's.
_VALUE_INIT_OPS = frozenset(
    "normal_ uniform_ fill_ zero_ random_ exponential_ bernoulli_ cauchy_ log_normal_ "
    "geometric_ copy_ erfinv_ mul_ add_ sub_ div_ clamp_ clamp_min_ clamp_max_ abs_ sqrt_ exp_ "
    "log_ neg_ trunc_normal_ kaiming_uniform_ kaiming_normal_ xavier_uniform_ xavier_normal_ "
    "orthogonal_ sparse_ eye_ dirac_ constant_ ones_ zeros_".split()
)


class _SkipMetaInit(torch.overrides.TorchFunctionMode):
    """Skip in-place ops (``normal_``, ``uniform_``, ...) on meta tensors while modules are built.

    They change no data there, and some (``normal_``) are implemented in Python on meta and
    import torch._dynamo the first time: seconds for an ``nn.Embedding``.
    """

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _VALUE_INIT_OPS:
            target = next(iter((*args, *kwargs.values())), None)  # nn.init passes tensor=
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with parameters on the meta device: any size, no memory, no init time.

    Examples:
        >>> with init_empty_weights():
        ...     model = torch.nn.Sequential(*[torch.nn.Linear(50_000, 50_000) for _ in range(4)])
        >>> sum(p.numel() for p in model.parameters())  # 10B parameters in a millisecond
        10000200000
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield
