"""Placing a model over devices: the device map and the dispatch and offload entry points.

- ``infer_auto_device_map``: which module goes to which GPU, the CPU or the disk under
  ``max_memory``.
- ``dispatch_model`` / ``cpu_offload`` / ``disk_offload``: place the model and hook the modules
  whose weights are offloaded, so they come to the execution device just in time.
- ``cpu_offload_with_hook``: move a whole model onto the device at its forward, off on demand.

Call shapes follow Accelerate's. Does not own the arithmetic (``trainer.big_modeling.device_map``),
what streams from where (``trainer.big_modeling.streaming``), the hooks
(``trainer.big_modeling.hooks``) nor loading weights (``trainer.big_modeling.loading``). The hooks
serve inference: training an offloaded model is not supported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.big_modeling.device_map import (
    DeviceKey,
    DeviceMap,
    check_device_map,
    class_names,
    compute_module_sizes,
    fill_devices,
    lookup_device,
    normalize_device_map,
    parse_max_memory,
    resolve_dtype,
    torch_device,
)
from trainer.big_modeling.device_map import main_device as main_device_of
from trainer.big_modeling.hooks import ModelOffloadHook, remove_hooks
from trainer.big_modeling.streaming import require_loaded, stream_model
from trainer.errors import ConfigurationError

__all__ = [
    "UserCpuOffloadHook",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "infer_auto_device_map",
]


def infer_auto_device_map(
    model: torch.nn.Module,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: dict[str, torch.dtype | str] | None = None,
    clean_result: bool = True,
    offload_buffers: bool = False,
) -> DeviceMap:
    """Map modules to devices, filling GPUs by index, then ``"cpu"``, then ``"disk"``.

    Rules: modules are taken in definition order and placed whole while they fit; one that does
    not fit is split into its parameters and children unless its class name is in
    ``no_split_module_classes``, and a leaf or unsplittable module moves on to the next device.
    Sizes count parameters and buffers, in ``dtype`` for floating-point tensors; a tied weight
    counts once and its modules go to the same device. The execution devices (the first GPU and
    the CPU, or the CPU alone) keep room for the largest remaining layer, which an offloaded
    layer needs when it is brought in. The disk is always the implied last device.

    Args:
        max_memory: bytes or sizes (``"10GiB"``, ``"200MB"``) per device: GPU indices, ``"cpu"``,
            ``"disk"``. ``None``: the free memory of each GPU and the available RAM.
        no_split_module_classes: class names (strings) of modules kept whole, e.g. ``["Block"]``.
        dtype: the dtype weights will be loaded in (``load_checkpoint_and_dispatch(dtype=...)``).
        special_dtypes: per-tensor dtypes overriding ``dtype``.
        clean_result: merge entries whose siblings share a device into their parent's entry.
        offload_buffers: whether buffers of offloaded modules go with them (else they stay on the
            execution device; a warning says when they do not fit there).

    Returns:
        ``{module or tensor name: device}`` with devices as GPU indices, ``"cpu"`` or ``"disk"``.

    Raises:
        ConfigurationError: a ``max_memory`` key that is no device or a value that is no size.

    Examples:
        >>> net = torch.nn.Sequential(*[torch.nn.Linear(100, 100) for _ in range(4)])  # 40,400 B each
        >>> infer_auto_device_map(net, max_memory={"cpu": 3 * 40_400})  # one layer kept in reserve
        {'0': 'cpu', '1': 'cpu', '2': 'disk', '3': 'disk'}
    """
    memory = parse_max_memory(max_memory)
    specials = {
        name: resolve_dtype(d, "special_dtypes") for name, d in (special_dtypes or {}).items()
    }
    sizes = compute_module_sizes(model, resolve_dtype(dtype), specials)  # type: ignore[arg-type]  # resolve_dtype only returns None for None
    no_split = class_names(no_split_module_classes)
    return fill_devices(
        model, memory, no_split, sizes, offload_buffers=offload_buffers, clean=clean_result
    )


def dispatch_model(
    model: torch.nn.Module,
    device_map: DeviceMap,
    main_device: torch.device | str | int | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: dict[str, dict[str, Any]] | None = None,
    offload_buffers: bool = False,
    skip_keys: list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
) -> torch.nn.Module:
    """Place ``model`` as ``device_map`` says and hook it so a forward call just works.

    Modules mapped to a device are moved there. Modules mapped to ``"disk"`` (and to ``"cpu"``
    when the main device is a GPU) are offloaded: their weights become meta placeholders, and
    a hook on each module that owns weights loads them onto the main device right before its
    forward and drops them after. The model's output comes back on the input's device.

    Args:
        device_map: ``{module or tensor name: device}``, e.g. from ``infer_auto_device_map``.
        main_device: where offloaded modules run (default: the first GPU of the map, else CPU).
        state_dict: CPU tensors to read offloaded weights from instead of the model's.
        offload_dir: folder of disk-offloaded weights; those not already in its ``index.json``
            are written there from the model.
        offload_index: an offload index to use instead of ``offload_dir/index.json``.
        offload_buffers: offload buffers too (else they stay on the main device).
        skip_keys: keys of dict inputs/outputs not to move (caches).
        preload_module_classes: class names whose whole subtree is loaded at their forward
            (for modules that use a child's weights outside the child's forward).
        force_hooks: hook even when the whole model is on one device.

    Returns:
        ``model`` itself, with ``model.hf_device_map`` set.

    Raises:
        ConfigurationError: the map misses tensors, puts everything on disk, needs an
            ``offload_dir``, or leaves a meta tensor without weights.

    Examples:
        >>> import tempfile
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> net = dispatch_model(net, {"0": "cpu", "1": "disk"}, offload_dir=tempfile.mkdtemp())
        >>> net[1].weight.device, net(torch.ones(1, 2)).shape
        (device(type='meta'), torch.Size([1, 2]))
    """
    device_map = normalize_device_map(device_map)
    check_device_map(model, device_map)
    devices = set(device_map.values())
    if len(devices) == 1 and devices != {"disk"} and not force_hooks:
        require_loaded(model, lambda name: False)
        model.to(torch_device(next(iter(devices))))
    else:
        main = torch_device(main_device) if main_device is not None else main_device_of(device_map)
        offloaded = ("disk",) if main.type in ("cpu", "mps") else ("cpu", "disk")

        def tier(name: str) -> str | None:
            device = lookup_device(name, device_map)
            return ("disk" if device == "disk" else "memory") if device in offloaded else None

        def execution_device(name: str) -> torch.device | None:
            device = lookup_device(name, device_map)
            return None if device is None else main if device in offloaded else torch_device(device)

        folder = Path(offload_dir) if offload_dir is not None else None
        if folder is None and offload_index is None and "disk" in devices:
            disk = sorted(name for name, device in device_map.items() if device == "disk")
            raise ConfigurationError(
                f"dispatch_model: device_map sends {disk} to 'disk' but offload_dir is None; pass offload_dir=<a folder>."
            )
        stream_model(
            model,
            tier,
            execution_device,
            set(device_map),
            state_dict=state_dict,
            folder=folder,
            index=dict(offload_index) if offload_index is not None else None,
            offload_buffers=offload_buffers,
            preload=class_names(preload_module_classes),
            skip_keys=skip_keys,
        )
    model.hf_device_map = dict(device_map)  # type: ignore[assignment]  # Accelerate's attribute
    return model


def cpu_offload(
    model: torch.nn.Module,
    execution_device: torch.device | str | int | None = None,
    offload_buffers: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> torch.nn.Module:
    """Keep every weight in CPU RAM and bring each module's onto ``execution_device`` at its forward.

    Between calls the parameters are meta placeholders; the CPU copies live in the hooks.

    Args:
        execution_device: where forward runs (default: the device of the first parameter).
        offload_buffers: offload buffers too (else they are moved to ``execution_device``).
        state_dict: the CPU tensors to use (default: the model's own, moved to the CPU).
        preload_module_classes: class names loaded as one piece (see ``dispatch_model``).

    Examples:
        >>> net = cpu_offload(torch.nn.Linear(2, 2))
        >>> net.weight.device, net(torch.ones(1, 2)).shape
        (device(type='meta'), torch.Size([1, 2]))
    """
    device = _execution_device(model, execution_device)
    stream_model(
        model,
        lambda name: "memory",
        lambda name: device,
        {""},
        state_dict=state_dict,
        offload_buffers=offload_buffers,
        preload=class_names(preload_module_classes),
    )
    return model


def disk_offload(
    model: torch.nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: torch.device | str | int | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> torch.nn.Module:
    """Write every weight to ``offload_dir`` (one safetensors file each) and stream it per module.

    Each module's weights are memory-mapped from their files right before its forward and
    released after it, so RAM holds one module's weights at a time. Tensors of a meta model that
    are listed in ``offload_dir/index.json`` are read from there.

    Examples:
        >>> import tempfile
        >>> net = disk_offload(torch.nn.Linear(2, 2), tempfile.mkdtemp())
        >>> net.weight.device, net(torch.ones(1, 2)).shape
        (device(type='meta'), torch.Size([1, 2]))
    """
    device = _execution_device(model, execution_device)
    stream_model(
        model,
        lambda name: "disk",
        lambda name: device,
        {""},
        folder=Path(offload_dir),
        offload_buffers=offload_buffers,
        preload=class_names(preload_module_classes),
    )
    return model


class UserCpuOffloadHook:
    """The handle ``cpu_offload_with_hook`` returns: ``offload()`` the model, or ``remove()`` the hook."""

    def __init__(self, model: torch.nn.Module, hook: ModelOffloadHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to the CPU."""
        self.model.to("cpu")

    def remove(self) -> None:
        """Stop moving the model at forward (it stays where it is)."""
        remove_hooks(self.model, recurse=False)


def cpu_offload_with_hook(
    model: torch.nn.Module,
    execution_device: torch.device | str | int | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[torch.nn.Module, UserCpuOffloadHook]:
    """Move ``model`` to the CPU; at each forward move it (whole) to ``execution_device``.

    It stays there until ``hook.offload()``. Chained models pass the previous hook, which is
    offloaded when this model's forward starts: only one stage of a pipeline is on the GPU.

    Args:
        execution_device: default ``cuda:0`` when CUDA is available, else the CPU.
        prev_module_hook: the hook of the model that runs before this one.

    Returns:
        ``(model, hook)``.

    Examples:
        >>> encoder, hook1 = cpu_offload_with_hook(torch.nn.Linear(2, 2))
        >>> decoder, hook2 = cpu_offload_with_hook(torch.nn.Linear(2, 2), prev_module_hook=hook1)
        >>> decoder(encoder(torch.ones(1, 2))).shape  # encoder offloaded as decoder starts
        torch.Size([1, 2])
    """
    if execution_device is None:
        execution_device = "cuda:0" if torch.cuda.is_available() else "cpu"
    hook = ModelOffloadHook(torch_device(execution_device), prev_module_hook)
    hook.attach(model)
    return model, UserCpuOffloadHook(model, hook)


def _execution_device(
    model: torch.nn.Module, device: torch.device | str | int | None
) -> torch.device:
    """The given device, else the device of the first materialized parameter, else the CPU."""
    if device is not None:
        return torch_device(device)
    first = next((p.device for p in model.parameters() if p.device.type != "meta"), None)
    return first or torch.device("cpu")
