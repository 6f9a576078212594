"""Big models on small machines: build without memory, map to devices, load shard by shard, offload.

- ``init_empty_weights`` / ``init_on_device``: parameters (and buffers, if asked) are created on
  the meta device (or any device) as modules are constructed.
- ``infer_auto_device_map``: which module goes to which GPU, the CPU or the disk under
  ``max_memory``.
- ``load_checkpoint_in_model`` / ``load_checkpoint_and_dispatch``: weights from a safetensors
  file, a sharded index, a checkpoint or ``save_model`` directory or a legacy pickle (read with
  ``weights_only=True``), one tensor at a time, onto the mapped devices or into an offload folder.
- ``dispatch_model`` / ``cpu_offload`` / ``cpu_offload_with_hook`` / ``disk_offload``: forward
  hooks that bring weights and inputs to the execution device just in time and take them back.

Call shapes follow Accelerate's. The arithmetic lives in ``trainer.big_modeling.device_map``; reading files,
the offload folder and the hooks in ``trainer.big_modeling.offload``. The hooks serve inference: training an
offloaded model is not supported.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.big_modeling.device_map import (
    DeviceKey,
    DeviceMap,
    balanced_memory,
    check_device_map,
    class_names,
    compute_module_sizes,
    fill_devices,
    largest_layer,
    lookup_device,
    normalize_device_map,
    parse_max_memory,
    resolve_dtype,
    torch_device,
)
from trainer.big_modeling.device_map import main_device as main_device_of
from trainer.big_modeling.offload import (
    ModelOffloadHook,
    load_weights,
    remove_hooks,
    require_loaded,
    stream_model,
)
from trainer.errors import ConfigurationError

__all__ = [
    "UserCpuOffloadHook",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
]

_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


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
            kwargs = {
                k: v
                for k, v in module._parameters[name].__dict__.items()
                if k != "_is_hf_initialized"
            }
            module._parameters[name] = type(param)(
                module._parameters[name].to(device), requires_grad=param.requires_grad, **kwargs
            )

    def register_buffer(
        module: torch.nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        original_buffer(module, name, tensor, persistent=persistent)
        if tensor is not None:
            module._buffers[name] = module._buffers[name].to(device)

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


def load_checkpoint_in_model(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    strict: bool = False,
) -> dict[str, list[str]]:
    """Load weights into ``model`` one tensor at a time, also into an empty-weights model.

    Each tensor is read straight into its destination (no state dict is ever built): onto its
    device from ``device_map``, or, for ``"disk"``, recorded in ``offload_folder/index.json``
    (pointing into the checkpoint's own safetensors file when no cast is needed). Tied weights
    are re-tied. With ``dtype=None`` a meta parameter takes the checkpoint's dtype and a
    materialized one keeps its own (like ``load_state_dict``).

    A trainer checkpoint directory (one with a ``manifest.json``), or a file of one, is verified
    first, as ``trainer checkpoint verify`` does (every file's size and sha256, no symbolic link,
    every field); every shard a model index names must lie inside the index's folder. Both are
    checked before any tensor is read, so a refusal leaves ``model`` as it was.

    Args:
        checkpoint: a checkpoint or ``save_model`` directory, a ``.safetensors`` file, a
            ``*.index.json`` or a legacy ``.bin``/``.pt``/``.ckpt`` file.
        device_map: ``{module or tensor name: device}``; ``None`` keeps tensors where they are
            (meta ones on the CPU).
        offload_folder: required when ``device_map`` uses ``"disk"``.
        dtype: cast floating-point weights to this dtype.
        offload_state_dict: accepted for Accelerate compatibility; loading is per tensor anyway.
        offload_buffers: send buffers mapped to ``"disk"`` there too (else to the main device).
        strict: raise CheckpointError listing missing and unexpected keys and shape mismatches.

    Returns:
        ``{"missing_keys": [...], "unexpected_keys": [...], "mismatched_keys": [...]}``; a
        warning lists them when any is non-empty and ``strict`` is False.

    Raises:
        CheckpointError: unreadable checkpoint, a checkpoint directory that fails verification,
            or an index entry that is absolute, leaves its folder, goes through a symbolic link
            or is missing (naming the file, the field and the value); with ``strict``, any key
            problem.
        ConfigurationError: ``device_map`` misses tensors or uses ``"disk"`` without a folder.

    Examples:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> path = tempfile.mkdtemp() + "/model.safetensors"
        >>> save_file({"weight": torch.ones(2, 2), "bias": torch.zeros(2)}, path)
        >>> with init_empty_weights():
        ...     layer = torch.nn.Linear(2, 2)
        >>> load_checkpoint_in_model(layer, path)
        {'missing_keys': [], 'unexpected_keys': [], 'mismatched_keys': []}
    """
    del offload_state_dict  # per-tensor loading never holds a state dict to offload
    device_map = normalize_device_map(device_map) if device_map is not None else None
    if device_map is not None:
        check_device_map(model, device_map)
        if "disk" in device_map.values() and offload_folder is None:
            raise ConfigurationError(
                "load_checkpoint_in_model: device_map sends modules to 'disk'; pass offload_folder=<a folder> to hold them."
            )
    main = main_device_of(device_map)
    return load_weights(
        model,
        Path(checkpoint),
        device_of=(lambda name: _placement(name, device_map)) if device_map is not None else None,
        main_device=main,
        dtype=resolve_dtype(dtype),
        offload_folder=Path(offload_folder) if offload_folder is not None else None,
        offload_buffers=offload_buffers,
        strict=strict,
    )


def load_checkpoint_and_dispatch(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | str | None = None,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
) -> torch.nn.Module:
    """Load a checkpoint into an (empty-weights) model and dispatch it over the devices.

    ``device_map="auto"`` (or ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``) runs
    ``infer_auto_device_map`` with ``max_memory``, ``no_split_module_classes`` and ``dtype``
    first (the balanced maps spread weights evenly over several GPUs; with one GPU or none they
    equal ``"sequential"``). Then ``load_checkpoint_in_model`` and ``dispatch_model``.

    Returns:
        ``model``, ready for inference (``model.hf_device_map`` holds the map).

    Raises:
        ConfigurationError: an unknown ``device_map`` string, or disk offload without
            ``offload_folder``.
        CheckpointError: see ``load_checkpoint_in_model``.

    Examples:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> path = tempfile.mkdtemp() + "/model.safetensors"
        >>> weights = {f"{i}.weight": torch.ones(4, 4) for i in range(3)}  # 3 layers of 80 B
        >>> save_file({**weights, **{f"{i}.bias": torch.zeros(4) for i in range(3)}}, path)
        >>> with init_empty_weights():
        ...     net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
        >>> net = load_checkpoint_and_dispatch(net, path, device_map="auto",
        ...     max_memory={"cpu": 200}, offload_folder=tempfile.mkdtemp())
        >>> net.hf_device_map, net(torch.ones(1, 4)).tolist()
        ({'0': 'cpu', '1': 'disk', '2': 'disk'}, [[64.0, 64.0, 64.0, 64.0]])
    """
    if isinstance(device_map, str):
        if device_map not in _AUTO_MAPS:
            raise ConfigurationError(
                f"device_map={device_map!r}: expected a dict or one of {', '.join(map(repr, _AUTO_MAPS))}."
            )
        memory = parse_max_memory(max_memory)
        no_split = class_names(no_split_module_classes)
        if device_map != "sequential":
            sizes = compute_module_sizes(model, resolve_dtype(dtype))
            layer, _ = largest_layer(list(model.named_children()), sizes, no_split)
            low_zero = device_map == "balanced_low_0"
            memory = balanced_memory(memory, sizes, layer, low_zero=low_zero)
        device_map = infer_auto_device_map(
            model,
            memory,
            no_split,
            dtype,
            offload_buffers=offload_buffers,
        )
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map,
        offload_folder,
        dtype,
        offload_state_dict or False,
        offload_buffers,
        strict,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )


def _placement(name: str, device_map: DeviceMap) -> torch.device | str:
    """Where ``load_checkpoint_in_model`` puts tensor ``name``: a device or ``"disk"``."""
    device = lookup_device(name, device_map)
    return "disk" if device == "disk" else torch_device(device if device is not None else "cpu")


def _execution_device(
    model: torch.nn.Module, device: torch.device | str | int | None
) -> torch.device:
    """The given device, else the device of the first materialized parameter, else the CPU."""
    if device is not None:
        return torch_device(device)
    first = next((p.device for p in model.parameters() if p.device.type != "meta"), None)
    return first or torch.device("cpu")
