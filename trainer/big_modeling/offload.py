"""Weights in and out of memory: the checkpoint reader, the offload folder and the forward hooks.

Owns:

- reading checkpoints tensor by tensor: the files behind a checkpoint path (a trainer
  checkpoint folder verified against its manifest first, every file an index names confined to
  its folder), the safetensors header (parsed here, so a tensor is read with one ``readinto``
  straight into its destination and no file stays mapped), legacy pickles through
  ``torch.load(weights_only=True, mmap=True)``;
- the offload folder: ``index.json`` maps each offloaded tensor name to a safetensors file (one
  per tensor written here, or the checkpoint's own shard) and the key inside it;
- ``WeightsMap``, what an offloaded module reads its weights from at forward time: safetensors
  memory-mapped per module call and released when the module's forward returns;
- the hooks that move inputs and weights to the execution device just in time and back.

Does not own which module goes where (``trainer.big_modeling.device_map``) nor the public API
(``trainer.big_modeling``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.big_modeling.device_map import find_tied_parameters
from trainer.checkpoint.format import (
    MODEL_FILE,
    MODEL_INDEX,
    is_checkpoint_dir,
    is_format_file,
    verify_checkpoint,
)
from trainer.checkpoint.legacy import LEGACY_SUFFIXES, load_weights_file
from trainer.checkpoint.paths import resolve_inside
from trainer.errors import CheckpointError, ConfigurationError, describe

__all__ = [
    "OFFLOAD_INDEX",
    "AlignDevicesHook",
    "ModelOffloadHook",
    "StoredTensor",
    "WeightsMap",
    "iter_stored",
    "load_offload_index",
    "load_weights",
    "named_tensors",
    "offload_tensor",
    "read_safetensors_header",
    "remove_hooks",
    "require_loaded",
    "save_offload_index",
    "send_to_device",
    "set_module_tensor",
    "stream_model",
    "weight_files",
]

OFFLOAD_INDEX = "index.json"
_HOOK_ATTR = "_trainer_offload_hook"
_MAX_HEADER = 100 * 2**20
_CODES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}  # fmt: skip
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _CODES[getattr(torch, _name)] = _code
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a checkpoint, read on demand: a safetensors slice or a legacy tensor."""

    name: str  # its name in the model
    key: str  # its name in the file
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int = 0  # absolute byte offset of the data in a safetensors file
    value: torch.Tensor | None = None  # a legacy pickle's (memory-mapped) tensor

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new CPU tensor holding the data (in its own memory), cast to ``dtype``."""
        if self.value is not None:
            return self.value.to(dtype or self.dtype, copy=True)
        out = torch.empty(self.shape, dtype=self.dtype)
        self._fill(out)
        return out if dtype in (None, self.dtype) else out.to(dtype)

    def read_into(self, out: torch.Tensor) -> None:
        """Copy the data into ``out`` (in place); straight from the file when layouts agree."""
        direct = out.device.type == "cpu" and out.dtype == self.dtype and out.is_contiguous()
        if direct and self.value is None:
            self._fill(out)
        else:
            with torch.no_grad():
                out.copy_(self.read())

    def _fill(self, out: torch.Tensor) -> None:
        nbytes = out.numel() * out.element_size()
        if nbytes == 0:
            return
        view = memoryview(out.detach().reshape(-1).view(torch.uint8).numpy())
        with open(self.file, "rb", buffering=0) as file:
            file.seek(self.offset)
            done = 0
            while done < nbytes:  # read() returns at most ~2 GiB at a time
                count = file.readinto(view[done:])
                if not count:
                    raise CheckpointError(f"{self.file} is truncated: {self.key!r} is incomplete.")
                done += count

    def offload_entry(self) -> dict[str, Any] | None:
        """An offload-index entry pointing into the checkpoint itself (no copy), if possible."""
        if self.value is not None:
            return None
        return {"file": str(self.file.resolve()), "key": self.key, **_describe(self)}


def _describe(tensor: StoredTensor | torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}


def read_safetensors_header(path: Path) -> tuple[list[StoredTensor], dict[str, str]]:
    """The tensors (name, dtype, shape, offset) and metadata of a safetensors file; no data read.

    Raises:
        CheckpointError: the file is missing, truncated or not safetensors.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if size < 8 or length > min(size - 8, _MAX_HEADER):
                raise ValueError(f"header length {length} does not fit a {size}-byte file")
            header = json.loads(file.read(length))
        metadata = header.pop("__metadata__", None) or {}
        start = 8 + length
        stored = []
        for key, info in header.items():
            dtype, shape = _DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
            if end - begin != dtype.itemsize * math.prod(shape) or start + end > size:
                raise ValueError(f"{key!r} has offsets {[begin, end]} that do not match its shape")
            stored.append(StoredTensor(key, key, path, dtype, shape, start + begin))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file: {err}.") from err
    return stored, metadata


def weight_files(checkpoint: Path) -> tuple[list[Path], dict[str, str]]:
    """The tensor files behind ``checkpoint`` and the tied-weight aliases its index records.

    Nothing is read from a tensor file here, so a refusal leaves the model untouched:

    - a trainer checkpoint folder (one with a manifest), given as the folder or as one of its
      files, is verified first (`trainer.checkpoint.format.verify_checkpoint`: no symbolic
      link, no missing or unlisted file, every file's size and sha256, every field);
    - every file a model index (ours or a Hugging Face ``*.index.json``) names in its
      ``weight_map`` must be a relative path inside the index's folder, reached through no
      symbolic link (`trainer.checkpoint.paths.resolve_inside`), and must exist.

    Raises:
        CheckpointError: naming the file, and for an index entry the field and the value.
    """
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    ours = is_checkpoint_dir(folder) and (checkpoint.is_dir() or is_format_file(checkpoint.name))
    manifest = verify_checkpoint(folder) if ours else None
    if checkpoint.is_dir():
        checkpoint = _weights_in_directory(checkpoint, manifest)
        if checkpoint.suffix in LEGACY_SUFFIXES or checkpoint.name == MODEL_FILE:
            return [checkpoint], {}
    if checkpoint.name.endswith(".index.json"):
        return _indexed_files(checkpoint)
    if checkpoint.suffix == ".safetensors" or checkpoint.suffix in LEGACY_SUFFIXES:
        if not checkpoint.is_file():
            raise CheckpointError(f"checkpoint file {checkpoint} does not exist.")
        return [checkpoint], {}
    raise CheckpointError(
        f"cannot read weights from {checkpoint}: expected a directory, a .safetensors file, a "
        f"*.index.json or a legacy {'/'.join(LEGACY_SUFFIXES)} file."
    )


def _indexed_files(index_path: Path) -> tuple[list[Path], dict[str, str]]:
    """The shard files an index names, each confined to its folder, and its aliases."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{index_path} is not a readable weight index: {err}.") from err
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"{index_path}, field 'weight_map': expected a non-empty mapping of tensor names to "
            f"shard file names, received {describe(weight_map)}. The index is corrupt."
        )
    shards: dict[str, Path] = {}
    for tensor_name, shard in weight_map.items():
        field = f"weight_map.{tensor_name}"
        path = resolve_inside(index_path.parent, shard, source=index_path, field=field)
        if shard not in shards and not path.is_file():
            raise CheckpointError(
                f"{index_path}, field {field!r}: the shard {shard!r} does not exist in "
                f"{str(index_path.parent)!r}. The folder is incomplete."
            )
        shards[shard] = path
    metadata = index.get("metadata")
    aliases = (metadata.get("aliases") if isinstance(metadata, dict) else None) or {}
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
    ):
        raise CheckpointError(
            f"{index_path}, field 'metadata.aliases': expected a mapping of tensor names to "
            f"tensor names, received {describe(aliases)}. The index is corrupt."
        )
    return [shards[name] for name in sorted(shards)], dict(aliases)


def _weights_in_directory(directory: Path, manifest: dict[str, Any] | None) -> Path:
    candidates = [MODEL_FILE, MODEL_INDEX, "pytorch_model.bin.index.json", "pytorch_model.bin"]
    if manifest is not None:
        candidates = [name for name in candidates if name in manifest["files"]]
    for name in candidates:
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(
        f"{directory} holds no model weights (no {MODEL_FILE}, {MODEL_INDEX} or pytorch_model.bin). "
        "A sharded-strategy checkpoint needs `trainer checkpoint consolidate` first."
    )


def iter_stored(files: list[Path], aliases: dict[str, str]) -> Iterator[StoredTensor]:
    """Every tensor of ``files`` in file order, each tied alias right after the tensor it shares."""
    by_kept: dict[str, list[str]] = {}
    for alias, kept in aliases.items():
        by_kept.setdefault(kept, []).append(alias)
    for file in files:
        if file.suffix == ".safetensors":
            stored, metadata = read_safetensors_header(file)
            for alias, kept in json.loads(metadata.get("aliases", "{}")).items():
                if alias not in by_kept.get(kept, []):
                    by_kept.setdefault(kept, []).append(alias)
        else:
            stored = _legacy_tensors(file)
        for tensor in stored:
            yield tensor
            for alias in by_kept.get(tensor.name, []):
                yield dataclasses.replace(tensor, name=alias)


def _legacy_tensors(file: Path) -> list[StoredTensor]:
    """A pickle's tensors, memory-mapped when the file allows it (zip format), never unpickled."""
    try:
        loaded = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, AttributeError):
        loaded = load_weights_file(file)  # no mmap (old format), or raises the reason clearly
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise CheckpointError(f"{file} holds {type(loaded).__name__}, not a state dict of tensors.")
    return [
        StoredTensor(name, name, file, value.dtype, tuple(value.shape), value=value)
        for name, value in loaded.items()
    ]


def write_tensor_file(path: Path, key: str, tensor: torch.Tensor) -> None:
    """One tensor as a safetensors file (no hashing, no fsync: offload files are scratch)."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype not in _CODES:
        raise ConfigurationError(
            f"cannot offload {key!r}: dtype {tensor.dtype} has no safetensors code."
        )
    nbytes = tensor.numel() * tensor.element_size()
    entry = {
        "dtype": _CODES[tensor.dtype],
        "shape": list(tensor.shape),
        "data_offsets": [0, nbytes],
    }
    header = json.dumps({"__metadata__": {"format": "pt"}, key: entry}).encode("utf-8")
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        if nbytes:
            file.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))


def offload_tensor(folder: Path, name: str, tensor: torch.Tensor) -> dict[str, Any]:
    """Write ``tensor`` to ``folder/<name>.safetensors``; return its offload-index entry."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tensor_file(folder / f"{name}.safetensors", name, tensor)
    return {"file": f"{name}.safetensors", "key": name, **_describe(tensor)}


def load_offload_index(folder: Path) -> dict[str, dict[str, Any]]:
    """The offload index of ``folder`` (empty when there is none)."""
    path = folder / OFFLOAD_INDEX
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"offload index {path} is unreadable: {err}. Delete the folder."
        ) from err


def save_offload_index(folder: Path, index: Mapping[str, dict[str, Any]]) -> None:
    """Merge ``index`` into ``folder``'s offload index."""
    merged = {**load_offload_index(folder), **index}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OFFLOAD_INDEX).write_text(json.dumps(merged, indent=1, sort_keys=True), "utf-8")


class WeightsMap:
    """Where offloaded tensors are read from: tensors kept in memory, or an offload folder.

    Folder entries are memory-mapped by ``load`` (one ``safe_open`` per file per call) and the
    mapping lives only as long as the returned tensors do.
    """

    def __init__(
        self,
        memory: Mapping[str, torch.Tensor] | None = None,
        folder: Path | None = None,
        index: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.memory = dict(memory or {})
        self.folder = folder
        self.index = dict(index or {})

    def __contains__(self, name: object) -> bool:
        return name in self.memory or name in self.index

    def alias(self, name: str, existing: str) -> None:
        """Make ``name`` read what ``existing`` reads (a tied weight)."""
        if existing in self.memory:
            self.memory[name] = self.memory[existing]
        else:
            self.index[name] = self.index[existing]

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The tensors ``names``, on the CPU, memory-mapped when they come from files."""
        from safetensors import safe_open

        loaded = {name: self.memory[name] for name in names if name in self.memory}
        by_file: dict[str, list[str]] = {}
        for name in names:
            if name not in loaded:
                entry = self.index[name]
                path = Path(entry["file"])
                path = path if path.is_absolute() else Path(self.folder or ".") / path
                by_file.setdefault(str(path), []).append(name)
        for path, members in by_file.items():
            with safe_open(path, framework="pt", device="cpu") as handle:
                for name in members:
                    loaded[name] = handle.get_tensor(self.index[name]["key"])
        return loaded


def set_module_tensor(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Put ``value`` in place of parameter or buffer ``name`` (a dotted path under ``module``)."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if attr in owner._parameters:
        old = owner._parameters[attr]
        if not isinstance(value, torch.nn.Parameter):
            requires_grad = old.requires_grad if old is not None else False
            cls = type(old) if old is not None else torch.nn.Parameter
            value = cls(value, requires_grad=requires_grad and value.is_floating_point())
        owner._parameters[attr] = value
    elif attr in owner._buffers:
        owner._buffers[attr] = value
    else:
        raise ConfigurationError(f"{type(module).__name__} has no parameter or buffer {name!r}.")


def send_to_device(obj: Any, device: torch.device, skip_keys: list[str] | None = None) -> Any:
    """``obj`` with every tensor inside (tuples, lists, dicts, named tuples) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(send_to_device(item, device, skip_keys) for item in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(send_to_device(item, device, skip_keys) for item in obj)
    if isinstance(obj, Mapping):
        moved = {
            k: v if k in (skip_keys or ()) else send_to_device(v, device, skip_keys)
            for k, v in obj.items()
        }
        try:
            return type(obj)(moved)
        except TypeError:
            return moved
    return obj


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
            send_to_device(kwargs, self.execution_device, self.skip_keys),
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
            output = send_to_device(output, self._input_device, self.skip_keys)
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


# --- offloading a model: what streams, from where, and the hooks ------------------------------


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
    described = _describe(value)
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


# --- loading a checkpoint tensor by tensor ---------------------------------------------------


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
