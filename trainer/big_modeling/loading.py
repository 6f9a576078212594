"""Loading a checkpoint into a model tensor by tensor: the entry points and where each tensor goes.

- ``load_checkpoint_in_model``: weights from a safetensors file, a sharded index, a checkpoint or
  ``save_model`` directory or a legacy pickle (read with ``weights_only=True``), one tensor at a
  time, onto the mapped devices or into an offload folder; tied weights re-tied.
- ``load_checkpoint_and_dispatch``: a device map (``"auto"`` ...), then the load, then
  ``dispatch_model``.

Call shapes follow Accelerate's. Does not own reading the files (``trainer.big_modeling.
checkpoint_reader``, which verifies and confines them first), the offload folder
(``trainer.big_modeling.offload_folder``) nor dispatch (``trainer.big_modeling.dispatch``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.big_modeling.checkpoint_reader import StoredTensor, iter_stored, weight_files
from trainer.big_modeling.device_map import (
    DeviceKey,
    DeviceMap,
    balanced_memory,
    check_device_map,
    class_names,
    compute_module_sizes,
    find_tied_parameters,
    largest_layer,
    lookup_device,
    normalize_device_map,
    parse_max_memory,
    resolve_dtype,
    torch_device,
)
from trainer.big_modeling.device_map import main_device as main_device_of
from trainer.big_modeling.dispatch import dispatch_model, infer_auto_device_map
from trainer.big_modeling.hooks import set_module_tensor
from trainer.big_modeling.offload_folder import WeightsMap, offload_tensor, save_offload_index
from trainer.errors import CheckpointError, ConfigurationError

__all__ = ["load_checkpoint_and_dispatch", "load_checkpoint_in_model", "load_weights"]

_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


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
        >>> from trainer.big_modeling import init_empty_weights
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
        >>> from trainer.big_modeling import init_empty_weights
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


def load_weights(
    model: torch.nn.Module,
    checkpoint: Path,
    *,
    device_of: Callable[[str], torch.device | str] | None,
    main_device: torch.device,
    dtype: torch.dtype | None,
    offload_folder: Path | None,
    offload_buffers: bool,
    strict: bool,
) -> dict[str, list[str]]:
    """The work of ``load_checkpoint_in_model`` once its arguments are checked."""
    files, aliases = weight_files(checkpoint)
    loader = _Loader(model, device_of, main_device, dtype, offload_folder, offload_buffers)
    for stored in iter_stored(files, aliases):
        loader.take(stored)
    report = loader.finish()
    problems = {key: value for key, value in report.items() if value}
    if problems:
        message = f"load_checkpoint_in_model({os.fspath(checkpoint)!r}): " + "; ".join(
            f"{key}: {value}" for key, value in problems.items()
        )
        if strict:
            raise CheckpointError(
                message
                + ". Fix the model or the checkpoint, or pass strict=False to load what matches."
            )
        warnings.warn(message, stacklevel=3)
    return report


class _Loader:
    """One load: where each tensor goes, what was seen, what the offload folder now holds."""

    def __init__(
        self,
        model: torch.nn.Module,
        device_of: Callable[[str], torch.device | str] | None,
        main_device: torch.device,
        dtype: torch.dtype | None,
        folder: Path | None,
        offload_buffers: bool,
    ) -> None:
        self.model, self.device_of, self.main_device = model, device_of, main_device
        self.dtype, self.folder, self.offload_buffers = dtype, folder, offload_buffers
        self.expected = dict(model.state_dict(keep_vars=True))
        self.buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
        self.groups = find_tied_parameters(model)
        self.group_of = {name: group for group in self.groups for name in group}
        self.seen: set[str] = set()
        self.unexpected: list[str] = []
        self.mismatched: list[str] = []
        self.index: dict[str, dict[str, Any]] = {}

    def take(self, stored: StoredTensor) -> None:
        name, current = stored.name, self.expected.get(stored.name)
        if current is None:
            self.unexpected.append(name)
            return
        if tuple(current.shape) != stored.shape:
            self.mismatched.append(
                f"{name}: checkpoint {stored.shape} vs model {tuple(current.shape)}"
            )
            self.seen.add(name)  # present, just the wrong shape: reported once, as mismatched
            return
        if any(other in self.seen for other in self.group_of.get(name, ())):
            self.seen.add(name)  # a tied copy: finish() points it at the loaded one
            return
        dtype = self._dtype(stored, current)
        device = self._device(name, current)
        if device == "disk":
            self.index[name] = (
                stored.offload_entry() if dtype == stored.dtype else None
            ) or offload_tensor(self._folder(), name, stored.read(dtype))
            set_module_tensor(
                self.model, name, torch.empty(stored.shape, dtype=dtype, device="meta")
            )
        elif not current.is_meta and current.device == device and current.dtype == dtype:
            stored.read_into(current.detach())
        else:
            set_module_tensor(self.model, name, stored.read(dtype).to(device))
        self.seen.add(name)

    def _dtype(self, stored: StoredTensor, current: torch.Tensor) -> torch.dtype:
        if self.dtype is not None and stored.dtype.is_floating_point:
            return self.dtype
        if current.is_meta and stored.dtype.is_floating_point:
            return stored.dtype
        return current.dtype

    def _device(self, name: str, current: torch.Tensor) -> torch.device | str:
        if self.device_of is None:
            return current.device if not current.is_meta else torch.device("cpu")
        device = self.device_of(name)
        if device == "disk" and name in self.buffers and not self.offload_buffers:
            return self.main_device  # buffers of offloaded modules stay with the computation
        return device

    def _folder(self) -> Path:
        if self.folder is None:
            raise ConfigurationError(
                "load_checkpoint_in_model: pass offload_folder= to offload to 'disk'."
            )
        return self.folder

    def finish(self) -> dict[str, list[str]]:
        """Re-tie tied weights, save the offload index, and report."""
        mismatched = {entry.partition(":")[0] for entry in self.mismatched}
        for group in self.groups:
            loaded = [n for n in group if n in self.seen and n not in mismatched]
            if loaded:
                for name in group:
                    if name != loaded[0] and name not in mismatched:
                        self._tie(name, loaded[0])
        if self.index:
            save_offload_index(self._folder(), self.index)
        return {
            "missing_keys": sorted(set(self.expected) - self.seen),
            "unexpected_keys": sorted(self.unexpected),
            "mismatched_keys": self.mismatched,
        }

    def _tie(self, name: str, source: str) -> None:
        """Give ``name`` the weight loaded under ``source`` (same object when on one device)."""
        self.seen.add(name)
        device = self._device(name, self.expected[name])
        if source in self.index:
            if device == "disk":
                self.index[name] = self.index[source]
                set_module_tensor(self.model, name, self.model.get_parameter(source))
                return
            weights = WeightsMap(folder=self.folder, index=self.index).load([source])[source]
            set_module_tensor(self.model, name, weights.to(device, copy=True))
            return
        param = self.model.get_parameter(source)
        if device == "disk":
            self.index[name] = offload_tensor(self._folder(), name, param)
            set_module_tensor(self.model, name, param.to("meta"))
        elif param.device == device:
            set_module_tensor(self.model, name, param)
        else:
            set_module_tensor(self.model, name, param.to(device))
