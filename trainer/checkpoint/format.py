"""The checkpoint directory format (DESIGN §6): write, verify, read, find the newest.

```
<name>/manifest.json          format name and version, each file's size and sha256, world size
<name>/model.safetensors      or model-0000i-of-0000N.safetensors + model.safetensors.index.json
<name>/optimizer.safetensors  optimizer state tensors, one entry per tensor
<name>/state.json             everything else as JSON (tensors by reference into state.safetensors)
```

The manifest is written last; a directory without a valid manifest is not a checkpoint. Loading
verifies every file against the manifest before reading any tensor, and never unpickles.

The manifest lists exactly the files of this format (`is_format_file`): the names above at the
top level, and, for a sharded save, the engine's own files under one of `ENGINE_DIRS` (``dcp/``
for ``torch.distributed.checkpoint``, ``deepspeed/``), which only that engine's no-code reader
opens. A manifest that lists any other file (a ``.bin``, a ``.pkl``, another folder) is refused,
even when its hashes match: re-hashing is no way to smuggle a file into a checkpoint.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.atomic import MANIFEST, atomic_directory, is_temporary
from trainer.checkpoint.codec import decode, encode
from trainer.checkpoint.paths import refuse_links
from trainer.checkpoint.schema import (
    check_manifest,
    check_model_index,
    check_state,
    check_tensor_aliases,
)
from trainer.checkpoint.tensor_files import (
    deduplicate,
    hash_file,
    read_safetensors,
    read_safetensors_names,
    shard_tensors,
    write_safetensors,
)
from trainer.errors import CheckpointError

__all__ = [
    "ENGINE_DIRS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "find_latest_checkpoint",
    "is_checkpoint_dir",
    "is_format_file",
    "load_model_weights",
    "parse_size",
    "read_checkpoint",
    "read_manifest",
    "verify_checkpoint",
    "write_checkpoint",
    "write_model_files",
]

FORMAT_NAME = "trainer-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
MODEL_INDEX = "model.safetensors.index.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
STATE_TENSORS = "state.safetensors"
_SHARD_RE = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")
_TOP_LEVEL_FILES = frozenset({MODEL_FILE, MODEL_INDEX, OPTIMIZER_FILE, STATE_FILE, STATE_TENSORS})
# Sub-folders that hold a sharded engine's own files, written next to ours by
# `trainer.checkpoint.sharded.save_staged_checkpoint`: DCP shards (``sharded.DCP_DIR``) and
# DeepSpeed's (``trainer.strategies.deepspeed.ENGINE_DIR``). A new engine adds its folder here.
ENGINE_DIRS = ("dcp", "deepspeed")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string like "10GB", "500MB", "2GiB"."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = _SIZE_RE.match(size) if isinstance(size, str) else None
    if match is None:
        raise CheckpointError(
            f"max_shard_size={size!r}: expected a positive int of bytes or a string like '10GB' or '500MB'."
        )
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])


def write_model_files(
    directory: Path, state_dict: dict[str, torch.Tensor], max_shard_size: int | str = "10GB"
) -> dict[str, dict[str, Any]]:
    """Write model weights as one safetensors file or several shards plus an index.

    Tied weights are stored once; the aliases are recorded in the file metadata and restored on
    load. Returns the manifest records of the files written.
    """
    tensors, aliases = deduplicate(state_dict)
    metadata = {"format": "pt", "aliases": json.dumps(aliases)}
    shards = list(shard_tensors(tensors, parse_size(max_shard_size)))
    records: dict[str, dict[str, Any]] = {}
    if len(shards) == 1:
        records[MODEL_FILE] = write_safetensors(str(directory / MODEL_FILE), shards[0], metadata)
        return records
    weight_map = {}
    for index, shard in enumerate(shards, start=1):
        name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        records[name] = write_safetensors(
            str(directory / name), shard, metadata if index == 1 else {"format": "pt"}
        )
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index_text = json.dumps(
        {"metadata": {"total_size": total, "aliases": aliases}, "weight_map": weight_map},
        indent=2,
        sort_keys=True,
    )
    records[MODEL_INDEX] = _write_json(directory / MODEL_INDEX, index_text)
    return records


def _write_json(path: Path, text: str) -> dict[str, Any]:
    data = text.encode("utf-8")
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    import hashlib

    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_checkpoint(
    path: str | os.PathLike[str],
    checkpoint: dict[str, Any],
    *,
    world_size: int = 1,
    max_shard_size: int | str = "10GB",
) -> Path:
    """Write ``checkpoint`` as a checkpoint directory at ``path``, atomically.

    ``checkpoint["state_dict"]`` (model weights) goes to safetensors; ``"optimizer_states"``
    tensors to ``optimizer.safetensors``; every other key to ``state.json`` (tensors by reference
    into ``state.safetensors``). Returns the final path.

    Raises:
        CheckpointError: a value cannot be stored, or the write failed (the previous checkpoint
            under ``path``, if any, is left intact).
    """
    final = Path(path)
    with atomic_directory(final) as directory:
        write_checkpoint_files(
            directory, checkpoint, world_size=world_size, max_shard_size=max_shard_size
        )
    return final


def write_checkpoint_files(
    directory: Path,
    checkpoint: dict[str, Any],
    *,
    world_size: int = 1,
    max_shard_size: int | str = "10GB",
) -> None:
    """Write the files of ``checkpoint`` into ``directory``, then the manifest over everything in it.

    Files already in ``directory`` (a sharded engine's DCP shards) are listed in the manifest too.
    """
    rest = dict(checkpoint)
    model_state = rest.pop("state_dict", None)
    optimizer_states = rest.pop("optimizer_states", None)
    optimizer_tensors: dict[str, torch.Tensor] = {}
    state_tensors: dict[str, torch.Tensor] = {}
    document: dict[str, Any] = {}
    if optimizer_states is not None:
        document["optimizer_states"] = encode(optimizer_states, optimizer_tensors, "optimizer")
    document.update(encode(rest, state_tensors, "state"))
    present = _list_files(directory)
    for name in present:
        if not is_format_file(name):
            raise CheckpointError(
                f"cannot write checkpoint {directory}: it already holds {name}, which is not a "
                f"file of the checkpoint format (a sharded engine's files go under one of "
                f"{', '.join(f'{d}/' for d in ENGINE_DIRS)}; see trainer.checkpoint.format."
                "ENGINE_DIRS). A manifest listing it would be refused on load."
            )
    records: dict[str, dict[str, Any]] = {
        name: hash_file(str(directory / name)) for name in present
    }
    # The tensor files are written concurrently: each hashes on its own thread, so a model
    # and its optimizer state use both cores.
    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = []
        if model_state is not None:
            jobs.append(pool.submit(write_model_files, directory, model_state, max_shard_size))
        for name, tensors in (
            (OPTIMIZER_FILE, optimizer_tensors if optimizer_states is not None else None),
            (STATE_TENSORS, state_tensors or None),
        ):
            if tensors is not None:
                jobs.append(
                    pool.submit(
                        lambda n, t: {n: write_safetensors(str(directory / n), t)}, name, tensors
                    )
                )
        for job in jobs:
            records.update(job.result())
    records[STATE_FILE] = _write_json(directory / STATE_FILE, json.dumps(document, indent=1))
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        "world_size": world_size,
        "epoch": rest.get("epoch"),
        "global_step": rest.get("global_step"),
        "files": dict(sorted(records.items())),
    }
    _write_json(directory / MANIFEST, json.dumps(manifest, indent=1))


def _list_files(directory: Path) -> list[str]:
    """Every file under ``directory`` (relative, "/"-separated), the manifest excluded."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if relative != MANIFEST:
                found.append(relative)
    return sorted(found)


def is_format_file(name: str) -> bool:
    """Whether ``name`` (relative, "/"-separated, as a manifest lists it) is a file of the format.

    At the top level: ``model.safetensors``, ``model-0000i-of-0000N.safetensors``,
    ``model.safetensors.index.json``, ``optimizer.safetensors``, ``state.json`` and
    ``state.safetensors``. Below it: any file inside one of `ENGINE_DIRS` (a sharded engine's
    shards, which only that engine's no-code reader opens). Nothing else.

    Example:
        >>> is_format_file("model-00001-of-00003.safetensors"), is_format_file("optimizer.bin")
        (True, False)
    """
    parts = name.split("/")
    if any(part in ("", ".", "..") or "\\" in part for part in parts):
        return False  # only plain names: "dcp/../optimizer.bin" is not inside dcp/
    if len(parts) > 1:
        return parts[0] in ENGINE_DIRS
    return name in _TOP_LEVEL_FILES or _SHARD_RE.fullmatch(name) is not None


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed, checked manifest of a checkpoint directory (files not yet verified).

    The folder may hold no symbolic link; every record is type- and range-checked
    (`trainer.checkpoint.schema.check_manifest`), every file name stays inside the folder, and
    every listed file is one the format defines (`is_format_file`).
    """
    directory = Path(path)
    manifest_path = directory / MANIFEST
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory} does not exist or is not a directory.")
    refuse_links(directory)
    if not manifest_path.is_file():
        raise CheckpointError(
            f"{directory} is not a trainer checkpoint: it has no {MANIFEST} (an unfinished or foreign directory)."
        )
    manifest = _load_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{manifest_path} is not a trainer checkpoint manifest (format {manifest.get('format') if isinstance(manifest, dict) else None!r})."
        )
    if manifest.get("format_version") != FORMAT_VERSION or isinstance(
        manifest.get("format_version"), bool
    ):
        raise CheckpointError(
            f"{manifest_path} has format version {manifest.get('format_version')!r}; this trainer reads version {FORMAT_VERSION}. Use the trainer version that wrote it."
        )
    check_manifest(manifest, directory=directory, source=manifest_path)
    for name in sorted(manifest["files"]):
        if not is_format_file(name):
            raise CheckpointError(
                f"checkpoint {directory}: {MANIFEST} lists {name}, which is not a file of the "
                "checkpoint format (safetensors and JSON files with fixed names, and a sharded "
                f"engine's files under {' or '.join(f'{d}/' for d in ENGINE_DIRS)}). Refusing "
                "the checkpoint: it was altered after saving. Remove the file and its manifest "
                "entry, or use another checkpoint."
            )
    return manifest


def _load_json(path: Path) -> Any:
    """A JSON file of a checkpoint; NaN and Infinity literals (never written) are refused."""
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path} is unreadable or corrupt: {err}.") from err


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"the literal {name} is not valid JSON")


def verify_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file against the manifest (format files only, presence, no extras, size,
    sha256); return it.

    Then the fields of ``state.json`` and of the model index are checked as a load would
    (`trainer.checkpoint.schema`), reading only the tensor files' headers.

    Raises:
        CheckpointError: naming the first file that is missing, unexpected, truncated or altered,
            or the file, field and value that is invalid.
    """
    directory = Path(path)
    manifest = _check_listing(directory)
    with ThreadPoolExecutor(max_workers=4) as pool:
        _check_hashes(directory, manifest, _start_hashing(pool, directory, manifest))
    try:
        _read_state(directory, manifest["files"], read_safetensors)  # RNG states tried for real
        _model_tensors(directory, manifest["files"], read_safetensors_names)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors' own error: a re-hashed file that is not safetensors
        raise CheckpointError(
            f"checkpoint {directory} could not be verified: {err}. It is damaged or was altered; "
            "use another checkpoint."
        ) from err
    return manifest


def _check_listing(directory: Path) -> dict[str, Any]:
    """The manifest, after checking presence, extras and sizes of the files (no reading)."""
    manifest = read_manifest(directory)
    expected: dict[str, dict[str, Any]] = manifest["files"]
    present = set(_list_files(directory))
    for name in sorted(expected):
        if name not in present:
            raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing.")
    for name in sorted(present - set(expected)):
        raise CheckpointError(
            f"checkpoint {directory} holds a file its manifest does not list: {name}. Remove it or re-save."
        )
    for name, record in expected.items():
        size = (directory / name).stat().st_size
        if size != record.get("size"):
            raise CheckpointError(
                f"checkpoint file {directory / name} has {size} bytes; the manifest says {record.get('size')} (truncated or altered)."
            )
    return manifest


def _start_hashing(
    pool: ThreadPoolExecutor, directory: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    return {
        name: pool.submit(hash_file, str(directory / name)) for name in sorted(manifest["files"])
    }


def _check_hashes(directory: Path, manifest: dict[str, Any], futures: dict[str, Any]) -> None:
    for name, future in futures.items():
        if future.result()["sha256"] != manifest["files"][name].get("sha256"):
            raise CheckpointError(
                f"checkpoint file {directory / name} does not match its sha256 in the manifest (corrupt or altered)."
            )


def is_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like a checkpoint directory (has a manifest; not verified)."""
    return (Path(path) / MANIFEST).is_file()


_Reader = Callable[[str], tuple[Mapping[str, torch.Tensor], dict[str, str]]]


def load_model_weights(
    directory: Path, files: Mapping[str, Any], device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Model weights of a checkpoint or save_model directory, tied weights restored.

    Only files listed in ``files`` (the manifest's records) are read; an index's shard names are
    checked (`trainer.checkpoint.schema.check_model_index`) before any shard is opened.
    """
    return _model_tensors(directory, files, lambda name: read_safetensors(name, device))


def _model_tensors(directory: Path, files: Mapping[str, Any], read: _Reader) -> dict[str, Any]:
    """The model's tensors as ``read`` gives them (real, or stand-ins when only verifying)."""
    if MODEL_FILE in files:
        found, metadata = read(str(directory / MODEL_FILE))
        tensors = dict(found)
        source, field = directory / MODEL_FILE, "__metadata__.aliases"
        try:
            aliases = json.loads(metadata.get("aliases", "{}"))
        except ValueError as err:
            raise CheckpointError(f"{source}: field {field!r} is not JSON ({err}).") from err
    elif MODEL_INDEX in files:
        source, field = directory / MODEL_INDEX, "metadata.aliases"
        index = _load_json(source)
        tensors = {}
        for shard in check_model_index(index, directory=directory, source=source, listed=files):
            tensors.update(read(str(directory / shard))[0])
        aliases = index.get("metadata", {}).get("aliases", {})
    else:
        return {}
    for alias, kept in check_tensor_aliases(aliases, tensors, source=source, field=field).items():
        tensors[alias] = tensors[kept]
    return tensors


def _read_state(directory: Path, files: Mapping[str, Any], read: _Reader) -> tuple[dict, Any]:
    """``state.json`` decoded and checked (`check_state`), and its still encoded optimizer part.

    Optimizer tensors are stand-ins here (``read`` gives only their names), so a bad field is
    refused before any large tensor is loaded.
    """
    source = directory / STATE_FILE
    if STATE_FILE not in files:
        raise CheckpointError(
            f"{directory / MANIFEST}: field 'files' does not list {STATE_FILE}. A checkpoint "
            "always has one; the manifest is corrupt or was edited. Use another checkpoint."
        )
    document = _load_json(source)
    state_tensors = read(str(directory / STATE_TENSORS))[0] if STATE_TENSORS in files else {}
    optimizer_doc = document.pop("optimizer_states", None) if isinstance(document, dict) else None
    state = decode(document, state_tensors, source=str(source))
    if optimizer_doc is not None:
        names = (
            read_safetensors_names(str(directory / OPTIMIZER_FILE))[0]
            if OPTIMIZER_FILE in files
            else {}
        )
        state["optimizer_states"] = decode(
            optimizer_doc, names, source=str(source), path="optimizer_states"
        )
    check_state(state, source=source)
    return state, optimizer_doc


def read_checkpoint(
    path: str | os.PathLike[str], *, device: str = "cpu", verify: bool = True
) -> dict[str, Any]:
    """Verify (unless ``verify=False``) and load a checkpoint directory into one dict.

    The dict has ``"state_dict"`` (model weights), ``"optimizer_states"`` (if saved) and every
    key of ``state.json``. The manifest is checked before any file is read, and ``state.json``
    and the model index before any large tensor is loaded (`trainer.checkpoint.schema`).

    Raises:
        CheckpointError: a file is missing, unlisted, altered, or holds an invalid field (the
            message names the file, the field and the value).
    """
    directory = Path(path)
    manifest = _check_listing(directory) if verify else read_manifest(directory)
    files = manifest["files"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        # Hash on worker threads while the tensors are read; nothing is returned unverified.
        futures = _start_hashing(pool, directory, manifest) if verify else {}
        try:
            checkpoint, optimizer_doc = _read_state(
                directory, files, lambda name: read_safetensors(name, device)
            )
            _model_tensors(directory, files, read_safetensors_names)  # the index, before shards
            optimizer_tensors = (
                read_safetensors(str(directory / OPTIMIZER_FILE), device)[0]
                if OPTIMIZER_FILE in files
                else {}
            )
            model = load_model_weights(directory, files, device)
        except CheckpointError:  # an altered file is reported as such, before what it holds
            _check_hashes(directory, manifest, futures)
            raise
        except Exception as err:  # a damaged file: report the integrity failure when that is why
            _check_hashes(directory, manifest, futures)
            raise CheckpointError(f"checkpoint {directory} could not be read: {err}.") from err
        _check_hashes(directory, manifest, futures)
    checkpoint["state_dict"] = model
    if optimizer_doc is not None:
        checkpoint["optimizer_states"] = decode(
            optimizer_doc,
            optimizer_tensors,
            source=str(directory / STATE_FILE),
            path="optimizer_states",
        )
    return checkpoint


def find_latest_checkpoint(dirpath: str | os.PathLike[str]) -> Path | None:
    """The newest complete and valid checkpoint under ``dirpath`` (by global step, then time).

    Torn or corrupt directories are skipped with a warning that names them.
    """
    root = Path(dirpath)
    if not root.is_dir():
        return None
    candidates: list[tuple[int, str, Path]] = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.is_symlink() or is_temporary(entry.name):
            continue
        try:
            manifest = read_manifest(entry)
        except CheckpointError as err:
            if (entry / MANIFEST).exists() or entry.name.startswith(
                ("epoch", "step", "last", "checkpoint")
            ):
                warnings.warn(f"skipping {entry}: {err}", stacklevel=2)
            continue
        candidates.append(
            (int(manifest.get("global_step") or 0), str(manifest.get("created", "")), entry)
        )
    for _, _, entry in sorted(candidates, reverse=True):
        try:
            verify_checkpoint(entry)
        except CheckpointError as err:
            warnings.warn(f"skipping corrupt or invalid checkpoint {entry}: {err}", stacklevel=2)
            continue
        return entry
    return None
