"""Offloading a model: which tensors stream, from where, and which modules get a hook.

`stream_model` does the work of ``dispatch_model``, ``cpu_offload`` and ``disk_offload``: the
tensors a tier function names are offloaded (kept in CPU memory or written to the offload folder,
unless the folder already holds them), replaced by meta placeholders, and hooked back in at
forward time; the rest is moved to its execution device, and tied weights are tied again.

Does not own the device map (``trainer.big_modeling.device_map``), the offload folder
(``trainer.big_modeling.offload_folder``) nor the hooks themselves
(``trainer.big_modeling.hooks``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.big_modeling.device_map import find_tied_parameters
from trainer.big_modeling.hooks import AlignDevicesHook, set_module_tensor
from trainer.big_modeling.offload_folder import (
    WeightsMap,
    entry_fields,
    load_offload_index,
    offload_tensor,
    save_offload_index,
)
from trainer.errors import ConfigurationError

__all__ = ["named_tensors", "require_loaded", "stream_model"]


def named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer under every name (tied ones under each of their names)."""
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return tensors


def require_loaded(model: torch.nn.Module, is_streamed: Callable[[str], bool]) -> None:
    """Refuse a model with meta tensors that no hook will bring in."""
    empty = [n for n, t in named_tensors(model).items() if t.is_meta and not is_streamed(n)]
    if empty:
        raise ConfigurationError(
            f"{len(empty)} tensors are still on the meta device ({', '.join(empty[:5])}): load "
            "them first with load_checkpoint_in_model(model, checkpoint, device_map, offload_folder=...)."
        )


def stream_model(
    model: torch.nn.Module,
    tier: Callable[[str], str | None],
    execution_device: Callable[[str], torch.device | None],
    block_names: set[str],
    *,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    folder: Path | None = None,
    index: dict[str, dict[str, Any]] | None = None,
    offload_buffers: bool = False,
    preload: list[str] | None = None,
    skip_keys: list[str] | None = None,
) -> None:
    """Offload the tensors ``tier`` names (to "memory" or "disk"), place the rest, attach hooks."""
    tensors = named_tensors(model)
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    groups = find_tied_parameters(model)
    streamed = {
        name: kind
        for name in tensors
        if (kind := tier(name)) is not None and (offload_buffers or name not in buffers)
    }
    weights = _weights_for(tensors, streamed, groups, state_dict, folder, index)
    for name, tensor in tensors.items():
        if name in streamed:  # (empty_like on meta imports ~30 MB of meta kernels: avoid it)
            set_module_tensor(model, name, tensor if tensor.is_meta else tensor.to("meta"))
            continue
        device = execution_device(name)
        if tensor.is_meta and name in weights:  # a buffer of an offloaded module, kept resident
            set_module_tensor(model, name, weights.load([name])[name].to(device, copy=True))
        elif not tensor.is_meta and tensor.device != device:
            set_module_tensor(model, name, tensor.to(device))
    require_loaded(model, lambda name: name in streamed)
    _retie(model, groups, set(streamed))
    _attach_hooks(
        model, "", block_names, set(streamed), weights, execution_device, preload or [], skip_keys
    )


def _weights_for(
    tensors: dict[str, torch.Tensor],
    streamed: dict[str, str],
    groups: list[list[str]],
    state_dict: Mapping[str, torch.Tensor] | None,
    folder: Path | None,
    index: dict[str, dict[str, Any]] | None,
) -> WeightsMap:
    """Where each streamed tensor is read from; materialized disk ones are written first."""
    index = index if index is not None else (load_offload_index(folder) if folder else {})
    memory: dict[str, torch.Tensor] = {}
    written: dict[str, dict[str, Any]] = {}
    partners = {name: group for group in groups for name in group}
    for name, kind in streamed.items():
        value = (state_dict or {}).get(name, tensors[name])
        if kind == "disk" and name in index:  # the folder wins (Accelerate's rule), if it fits
            _check_entry(name, index[name], value, folder)
        elif value.is_meta or any(other in written for other in partners.get(name, ())):
            continue  # comes from a tied partner (written once), or is missing
        elif kind == "memory":
            memory[name] = value.detach().to("cpu")
        elif folder is not None:
            written[name] = offload_tensor(folder, name, value)
    if written and folder is not None:
        save_offload_index(folder, written)
    weights = WeightsMap(memory, folder, {**index, **written})
    for group in groups:
        source = next((name for name in group if name in weights), None)
        for name in group:
            if source is not None and name in streamed and name not in weights:
                weights.alias(name, source)
    missing = [name for name in streamed if name not in weights]
    if missing:
        raise ConfigurationError(
            f"no weights for {len(missing)} offloaded tensors on the meta device ({', '.join(missing[:5])}): "
            "load them with load_checkpoint_in_model(model, checkpoint, device_map, offload_folder=...) "
            "or pass state_dict=."
        )
    return weights


def _check_entry(
    name: str, entry: dict[str, Any], value: torch.Tensor, folder: Path | None
) -> None:
    """Refuse an offload-index entry that cannot be this tensor (a folder of another model)."""
    described = entry_fields(value)
    if [entry.get("dtype"), entry.get("shape")] != [described["dtype"], described["shape"]]:
        raise ConfigurationError(
            f"offload folder {folder} holds {name!r} as {entry.get('dtype')} {entry.get('shape')} but the "
            f"model has {described['dtype']} {described['shape']}: it belongs to another model. Use an "
            "empty offload folder."
        )


def _retie(model: torch.nn.Module, groups: list[list[str]], streamed: set[str]) -> None:
    """Make resident tied names one Parameter again (moving them one by one made copies)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for group in groups:
        resident = [name for name in group if name not in streamed]
        for name in resident[1:]:
            if params[name].device == params[resident[0]].device:
                set_module_tensor(model, name, params[resident[0]])


def _attach_hooks(
    module: torch.nn.Module,
    name: str,
    block_names: set[str],
    streamed: set[str],
    weights: WeightsMap,
    execution_device: Callable[[str], torch.device | None],
    preload: list[str],
    skip_keys: list[str] | None,
) -> None:
    """Hook the root (output back to the input's device), block tops and modules that stream."""
    prefix = f"{name}." if name else ""
    whole = type(module).__name__ in preload
    if whole:
        paths = [n[len(prefix) :] for n in streamed if n.startswith(prefix)]
    else:
        direct = [n for n, _ in module.named_parameters(recurse=False, remove_duplicate=False)]
        direct += [n for n, _ in module.named_buffers(recurse=False, remove_duplicate=False)]
        paths = [path for path in direct if prefix + path in streamed]
    mine = {path: prefix + path for path in paths}
    if not name or name in block_names or mine:
        device = execution_device(name)
        if device is None and mine:
            device = execution_device(next(iter(mine.values())))
        AlignDevicesHook(
            device, weights=weights, streamed=mine, io_same_device=not name, skip_keys=skip_keys
        ).attach(module)
    if not whole:
        for child_name, child in module.named_children():
            _attach_hooks(
                child,
                prefix + child_name,
                block_names,
                streamed,
                weights,
                execution_device,
                preload,
                skip_keys,
            )
