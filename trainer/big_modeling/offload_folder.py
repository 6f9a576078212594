"""The offload folder: offloaded tensors on disk, its index, and where offloaded weights are read.

Owns:

- the folder's ``index.json``, mapping each offloaded tensor name to a safetensors file (one per
  tensor written here, or a checkpoint's own shard) and the key inside it, with its dtype and
  shape;
- writing one tensor as a scratch safetensors file (no hashing, no fsync);
- `WeightsMap`, what an offloaded module reads its weights from at forward time: tensors kept in
  memory, or folder entries memory-mapped per module call and released when the module's forward
  returns.

Does not own the safetensors format (``trainer.checkpoint.tensor_files``), which tensors are
offloaded (``trainer.big_modeling.streaming``, ``trainer.big_modeling.loading``) nor the hooks
(``trainer.big_modeling.hooks``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.tensor_files import DTYPE_CODES, read_safetensors_tensors
from trainer.errors import CheckpointError, ConfigurationError

if TYPE_CHECKING:
    from trainer.big_modeling.checkpoint_reader import StoredTensor

__all__ = [
    "OFFLOAD_INDEX",
    "WeightsMap",
    "entry_fields",
    "load_offload_index",
    "offload_tensor",
    "save_offload_index",
    "write_tensor_file",
]

OFFLOAD_INDEX = "index.json"


def entry_fields(tensor: StoredTensor | torch.Tensor) -> dict[str, Any]:
    """The dtype and shape an offload-index entry records, to check it against a model later."""
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}


def write_tensor_file(path: Path, key: str, tensor: torch.Tensor) -> None:
    """One tensor as a safetensors file (no hashing, no fsync: offload files are scratch)."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype not in DTYPE_CODES:
        raise ConfigurationError(
            f"cannot offload {key!r}: dtype {tensor.dtype} has no safetensors code."
        )
    nbytes = tensor.numel() * tensor.element_size()
    entry = {
        "dtype": DTYPE_CODES[tensor.dtype],
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
    return {"file": f"{name}.safetensors", "key": name, **entry_fields(tensor)}


def load_offload_index(folder: Path) -> dict[str, dict[str, Any]]:
    """The offload index of ``folder`` (empty when there is none)."""
    path = folder / OFFLOAD_INDEX
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, RecursionError) as err:  # Recursion: nested deep
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

    Folder entries are memory-mapped by ``load`` (each file opened once per call) and the
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
        loaded = {name: self.memory[name] for name in names if name in self.memory}
        by_file: dict[str, list[str]] = {}
        for name in names:
            if name not in loaded:
                entry = self.index[name]
                path = Path(entry["file"])
                path = path if path.is_absolute() else Path(self.folder or ".") / path
                by_file.setdefault(str(path), []).append(name)
        for path, members in by_file.items():
            keys = [self.index[name]["key"] for name in members]
            loaded.update(zip(members, read_safetensors_tensors(path, keys), strict=True))
        return loaded
