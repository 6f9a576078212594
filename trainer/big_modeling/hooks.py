"""The forward hooks that bring inputs and weights to the execution device just in time and back.

Owns:

- `AlignDevicesHook`, around one module's forward: inputs to the execution device, streamed
  weights loaded from a `WeightsMap` before it and replaced by meta placeholders after it, and
  (on the model's root) the output back on the input's device;
- `ModelOffloadHook`, the whole-model hook of ``cpu_offload_with_hook``;
- `remove_hooks`, and `set_module_tensor` (swap one parameter or buffer); nested inputs move
  with `trainer.data.transfer.send_to_device`.

Does not own which modules are hooked (``trainer.big_modeling.streaming``) nor where weights are
stored (``trainer.big_modeling.offload_folder``). The hooks serve inference only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainer.big_modeling.offload_folder import WeightsMap
from trainer.data.transfer import send_to_device
from trainer.errors import ConfigurationError

__all__ = [
    "AlignDevicesHook",
    "ModelOffloadHook",
    "remove_hooks",
    "set_module_tensor",
]

_HOOK_ATTR = "_trainer_offload_hook"


def set_module_tensor(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Put ``value`` in place of parameter or buffer ``name`` (a dotted path under ``module``)."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    # nn.Module's own dicts: the public setters would refuse a plain tensor for a parameter.
    parameters, buffers = owner._parameters, owner._buffers  # noqa: SLF001
    if attr in parameters:
        old = parameters[attr]
        if not isinstance(value, torch.nn.Parameter):
            requires_grad = old.requires_grad if old is not None else False
            cls = type(old) if old is not None else torch.nn.Parameter
            value = cls(value, requires_grad=requires_grad and value.is_floating_point())
        parameters[attr] = value
    elif attr in buffers:
        buffers[attr] = value
    else:
        raise ConfigurationError(f"{type(module).__name__} has no parameter or buffer {name!r}.")


def _find_device(obj: Any) -> torch.device | None:
    if isinstance(obj, torch.Tensor):
        return obj.device
    items = (
        obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, list | tuple) else ()
    )
    for item in items:
        found = _find_device(item)
        if found is not None:
            return found
    return None


class _Hook:
    """Registration shared by the hooks: one of ours per module, found by ``remove_hooks``."""

    _handles: list[Any]

    def _register(self, module: torch.nn.Module, *handles: Any) -> None:
        self._handles = list(handles)
        setattr(module, _HOOK_ATTR, self)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class AlignDevicesHook(_Hook):
    """Around one module's forward: inputs to the execution device, streamed weights in and out.

    ``streamed`` maps a tensor path under the module to its name in ``weights``; those tensors
    are meta placeholders between calls. With ``io_same_device`` the output goes back to the
    device the input came from (set on the model's root).
    """

    def __init__(
        self,
        execution_device: torch.device | None,
        *,
        weights: WeightsMap | None = None,
        streamed: dict[str, str] | None = None,
        io_same_device: bool = False,
        skip_keys: list[str] | None = None,
    ) -> None:
        self.execution_device = execution_device
        self.weights = weights
        self.streamed = dict(streamed or {})
        self.io_same_device = io_same_device
        self.skip_keys = skip_keys
        self._placeholders: dict[str, torch.Tensor] = {}
        self._input_device: torch.device | None = None

    def attach(self, module: torch.nn.Module) -> None:
        """Register on ``module`` (replacing a hook of ours already there)."""
        remove_hooks(module, recurse=False)
        tensors = dict(module.named_parameters(remove_duplicate=False))
        tensors.update(module.named_buffers(remove_duplicate=False))
        self._placeholders = {path: tensors[path] for path in self.streamed}
        self._register(
            module,
            module.register_forward_pre_hook(self.pre_forward, with_kwargs=True),
            module.register_forward_hook(self.post_forward, with_kwargs=True, always_call=True),
        )

    def pre_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.io_same_device:
            self._input_device = _find_device((args, kwargs))
        if self.streamed and self.weights is not None:
            loaded = self.weights.load(list(self.streamed.values()))
            for path, name in self.streamed.items():
                set_module_tensor(module, path, loaded[name].to(self.execution_device))
        if self.execution_device is None:
            return args, kwargs
        return (
            send_to_device(args, self.execution_device),
            send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys),
        )

    def post_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        for path, placeholder in self._placeholders.items():
            set_module_tensor(module, path, placeholder)
        if self.io_same_device and _find_device(output) == torch.device("meta"):
            raise ConfigurationError(
                f"{type(module).__name__} returned a tensor on the meta device: a module read an "
                "offloaded weight outside its own forward (e.g. F.linear(x, self.child.weight)). "
                "Pass preload_module_classes=[<that module's class name>]."
            )
        if self.io_same_device and self._input_device is not None:
            output = send_to_device(output, self._input_device, skip_keys=self.skip_keys)
        return output


class ModelOffloadHook(_Hook):
    """Whole-model offload for ``cpu_offload_with_hook``: onto the device at forward, off on demand."""

    def __init__(self, execution_device: torch.device, previous: Any | None = None) -> None:
        self.execution_device = execution_device
        self.previous = previous

    def attach(self, module: torch.nn.Module) -> None:
        remove_hooks(module, recurse=False)
        module.to("cpu")
        self._register(module, module.register_forward_pre_hook(self.pre_forward, with_kwargs=True))

    def pre_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.previous is not None:
            self.previous.offload()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device
        )


def remove_hooks(module: torch.nn.Module, recurse: bool = True) -> None:
    """Detach the offload hooks of ``module`` (and of its submodules with ``recurse``)."""
    for submodule in module.modules() if recurse else (module,):
        hook = submodule.__dict__.pop(_HOOK_ATTR, None)
        if hook is not None:
            hook.detach()
