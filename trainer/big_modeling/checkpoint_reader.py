"""Reading a checkpoint tensor by tensor, for ``load_checkpoint_in_model``.

Owns:

- the files behind a checkpoint path (`weight_files`): a trainer checkpoint folder verified
  against its manifest first, every file an index names confined to its folder;
- `StoredTensor`, one tensor read on demand: a safetensors slice read with one ``readinto``
  straight into its destination (no file stays mapped), or a legacy pickle's tensor read through
  ``torch.load(weights_only=True, mmap=True)``;
- `iter_stored`, every tensor of those files with the tied-weight aliases the index records.

Does not own the safetensors format (``trainer.checkpoint.tensor_files`` parses headers and
reads bytes), where a tensor goes (``trainer.big_modeling.loading``) nor the offload folder
(``trainer.big_modeling.offload_folder``).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.big_modeling.offload_folder import entry_fields
from trainer.checkpoint.atomic import MANIFEST
from trainer.checkpoint.format import (
    MODEL_FILE,
    MODEL_INDEX,
    OPTIMIZER_FILE,
    STATE_FILE,
    STATE_TENSORS,
    is_checkpoint_dir,
    is_format_file,
    verify_checkpoint,
)
from trainer.checkpoint.legacy import LEGACY_SUFFIXES, load_weights_file
from trainer.checkpoint.paths import resolve_inside
from trainer.checkpoint.tensor_files import parse_safetensors_header, read_tensor_into
from trainer.errors import CheckpointError, describe

__all__ = [
    "StoredTensor",
    "iter_stored",
    "read_safetensors_header",
    "weight_files",
]


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
        read_tensor_into(self.file, self.offset, out, key=self.key)

    def offload_entry(self) -> dict[str, Any] | None:
        """An offload-index entry pointing into the checkpoint itself (no copy), if possible."""
        if self.value is not None:
            return None
        return {"file": str(self.file.resolve()), "key": self.key, **entry_fields(self)}


def read_safetensors_header(path: Path) -> tuple[list[StoredTensor], dict[str, str]]:
    """The tensors (name, dtype, shape, offset) and metadata of a safetensors file; no data read.

    The header is parsed and checked by `trainer.checkpoint.tensor_files.parse_safetensors_header`.

    Raises:
        CheckpointError: the file is missing, truncated or not safetensors.
    """
    entries, metadata = parse_safetensors_header(path)
    stored = [StoredTensor(e.key, e.key, e.file, e.dtype, e.shape, e.offset) for e in entries]
    return stored, metadata


def weight_files(checkpoint: Path) -> tuple[list[Path], dict[str, str]]:
    """The tensor files behind ``checkpoint`` and the tied-weight aliases its index records.

    Nothing is read from a tensor file here, so a refusal leaves the model untouched:

    - a trainer checkpoint folder (one with a manifest; one with its ``state.json`` but no
      manifest is refused), given as the folder or as one of its files, is verified first (`trainer.checkpoint.format.verify_checkpoint`: no symbolic
      link, no missing or unlisted file, every file's size and sha256, every field);
    - every file a model index (ours or a Hugging Face ``*.index.json``) names in its
      ``weight_map`` must be a relative path inside the index's folder, reached through no
      symbolic link (`trainer.checkpoint.paths.resolve_inside`), and must exist.

    Raises:
        CheckpointError: naming the file, and for an index entry the field and the value.
    """
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    ours = is_checkpoint_dir(folder) and (checkpoint.is_dir() or is_format_file(checkpoint.name))
    if not ours:
        _refuse_checkpoint_without_manifest(folder)
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


def _refuse_checkpoint_without_manifest(folder: Path) -> None:
    """Refuse a folder holding a trainer checkpoint's own files (``state.json``, ...) but no
    manifest trainer wrote: its bytes cannot be verified (a copy stopped halfway, a stripped
    archive, a removed manifest). A ``save_model`` folder never holds these files."""
    marks = [
        name for name in (STATE_FILE, STATE_TENSORS, OPTIMIZER_FILE) if (folder / name).exists()
    ]
    if marks:
        raise CheckpointError(
            f"{folder} holds a trainer checkpoint's files ({', '.join(marks)}) but no valid "
            f"{MANIFEST}: none of its bytes can be verified, so nothing is loaded from it. Copy "
            "the checkpoint again from where it was saved, or load another one."
        )


def _indexed_files(index_path: Path) -> tuple[list[Path], dict[str, str]]:
    """The shard files an index names, each confined to its folder, and its aliases."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
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
    return [shards[name] for name in sorted(shards)], _aliases(aliases, index_path, "metadata")


def _aliases(aliases: Any, source: Path, field: str) -> dict[str, str]:
    """``aliases`` (from ``source``'s ``field``), checked to map tensor names to tensor names."""
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
    ):
        raise CheckpointError(
            f"{source}, field '{field}.aliases': expected a mapping of tensor names to tensor "
            f"names, received {describe(aliases)}. The file is corrupt."
        )
    return dict(aliases)


def _file_aliases(file: Path, metadata: dict[str, str]) -> dict[str, str]:
    """The aliases a safetensors file written by
    `trainer.checkpoint.format.write_model_files` records (a JSON string in its metadata)."""
    try:
        aliases = json.loads(metadata.get("aliases", "{}"))
    except (ValueError, RecursionError) as err:
        raise CheckpointError(
            f"{file}, field '__metadata__.aliases': expected a JSON object of tensor names to "
            f"tensor names, received {describe(metadata['aliases'])} ({err}). The file is corrupt."
        ) from err
    return _aliases(aliases, file, "__metadata__")


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
            for alias, kept in _file_aliases(file, metadata).items():
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
    for name in loaded:
        if not isinstance(name, str):
            raise CheckpointError(
                f"{file}: field 'state_dict.{name}' must be a str (a parameter's name), "
                f"got {type(name).__name__}; this is not a module's state dict."
            )
    return [
        StoredTensor(name, name, file, value.dtype, tuple(value.shape), value=value)
        for name, value in loaded.items()
    ]
