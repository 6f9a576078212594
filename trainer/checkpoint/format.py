"""The checkpoint directory format (DESIGN §6): write, verify, read, find the newest.

```
<name>/manifest.json          format name and version, each file's size and BLAKE3, world size
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

This module owns what goes in which file and reading it back. The manifest itself (the allowed
file names, writing it, reading it, checking the files' sizes and hashes against it) lives in
``trainer/checkpoint/manifest.py``; its names used elsewhere stay importable from here.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.atomic import (
    MANIFEST,
    atomic_directory,
    has_trainer_manifest,
    is_temporary,
)
from trainer.checkpoint.codec import decode, encode
from trainer.checkpoint.manifest import (
    ENGINE_DIRS,
    EXTRA_DIR,
    FORMAT_NAME,
    FORMAT_VERSION,
    MODEL_FILE,
    MODEL_INDEX,
    OPTIMIZER_FILE,
    STATE_FILE,
    STATE_TENSORS,
    allowing_extra_files,
    check_hashes,
    check_listing,
    check_position,
    is_format_file,
    load_json,
    read_manifest,
    record_digest,
    start_hashing,
    start_recording_present_files,
    write_json,
    write_manifest,
)
from trainer.checkpoint.schema import check_model_index, check_state, check_tensor_aliases
from trainer.checkpoint.tensor_files import (
    deduplicate,
    hash_read_tensors,
    load_executor,
    read_safetensors,
    read_safetensors_names,
    save_executor,
    shard_tensors,
    write_safetensors,
)
from trainer.errors import CheckpointError

__all__ = [
    "ENGINE_DIRS",
    "EXTRA_DIR",
    "EXTRA_FILES_KEY",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "find_latest_checkpoint",
    "is_checkpoint_dir",
    "is_format_file",
    "load_model_weights",
    "parse_size",
    "read_checkpoint",
    "read_manifest",
    "read_state",
    "verify_checkpoint",
    "write_checkpoint",
    "write_model_files",
]

# The checkpoint-dict key naming a folder of extra files to move in (`write_checkpoint_files`).
EXTRA_FILES_KEY = "__extra_files__"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1} | {f"{prefix}B": 1000**i for i, prefix in enumerate("KMGT", 1)}
_UNITS |= {f"{prefix}IB": 1024**i for i, prefix in enumerate("KMGT", 1)}


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
    records[MODEL_INDEX] = write_json(directory / MODEL_INDEX, index_text)
    return records


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
    known_records: Mapping[str, dict[str, Any]] | None = None,
) -> None:
    """Write the files of ``checkpoint`` into ``directory``, then the manifest over everything in it.

    Files already in ``directory`` (a sharded engine's DCP shards) are listed in the manifest too:
    with the record ``known_records`` gives for them (hashed by the ranks that wrote them,
    `trainer.checkpoint.rank_hashing`) when its size is the file's, else hashed here. ``checkpoint[EXTRA_FILES_KEY]``, when
    present, names a folder on the same file system (what the Accelerator's save hooks wrote):
    it is moved in as ``extra/`` and listed the same way.
    """
    known = {
        name: record
        for name, record in (known_records or {}).items()
        if (directory / name).is_file() and (directory / name).stat().st_size == record.get("size")
    }
    rest = dict(checkpoint)
    extra_files = rest.pop(EXTRA_FILES_KEY, None)
    if extra_files is not None:  # a save hook's folder, written beside: it joins the checkpoint
        os.rename(extra_files, directory / EXTRA_DIR)
        with allowing_extra_files():
            write_checkpoint_files(
                directory,
                rest,
                world_size=world_size,
                max_shard_size=max_shard_size,
                known_records=known_records,
            )
        return
    model_state = rest.pop("state_dict", None)
    optimizer_states = rest.pop("optimizer_states", None)
    optimizer_tensors: dict[str, torch.Tensor] = {}
    state_tensors: dict[str, torch.Tensor] = {}
    document: dict[str, Any] = {}
    if optimizer_states is not None:
        document["optimizer_states"] = encode(optimizer_states, optimizer_tensors, "optimizer")
    document.update(encode(rest, state_tensors, "state"))
    records: dict[str, dict[str, Any]] = {}
    # The tensor files are written concurrently, each hashing on its own thread, while the files
    # already there (a sharded engine's shards) are hashed: the cores share the work.
    with save_executor(directory, model_state, optimizer_tensors, state_tensors) as pool:
        present = start_recording_present_files(pool, directory, known)
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
        records.update((name, future.result()) for name, future in present.items())
        records.update(known)
    records[STATE_FILE] = write_json(directory / STATE_FILE, json.dumps(document, indent=1))
    write_manifest(
        directory,
        records,
        world_size=world_size,
        epoch=rest.get("epoch"),
        global_step=rest.get("global_step"),
    )


def verify_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file against the manifest (format files only, presence, no extras, size,
    digest: BLAKE3, or sha256 in older checkpoints); return it.

    Then the fields of ``state.json`` and of the model index are checked as a load would
    (`trainer.checkpoint.schema`), reading only the tensor files' headers.

    Raises:
        CheckpointError: naming the first file that is missing, unexpected, truncated or altered,
            or the file, field and value that is invalid.
    """
    directory = Path(path)
    manifest = check_listing(directory)
    with load_executor(manifest["files"]) as pool:
        check_hashes(directory, manifest, start_hashing(pool, directory, manifest))
    try:
        _read_state(directory, manifest, read_safetensors)  # RNG states tried for real
        _model_tensors(directory, manifest["files"], read_safetensors_names)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors' own error: a re-hashed file that is not safetensors
        raise CheckpointError(
            f"checkpoint {directory} could not be verified: {err}. It is damaged or was altered; "
            "use another checkpoint."
        ) from err
    return manifest


def is_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like a checkpoint directory (`has_trainer_manifest`; not verified)."""
    return has_trainer_manifest(path)


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
        index = load_json(source)
        tensors = {}
        for shard in check_model_index(index, directory=directory, source=source, listed=files):
            tensors.update(read(str(directory / shard))[0])
        aliases = index.get("metadata", {}).get("aliases", {})
    else:
        return {}
    for alias, kept in check_tensor_aliases(aliases, tensors, source=source, field=field).items():
        tensors[alias] = tensors[kept]
    return tensors


def _read_state(
    directory: Path, manifest: dict[str, Any], read: _Reader, *, with_optimizer: bool = True
) -> tuple[dict, Any]:
    """``state.json`` decoded and checked (`check_state`, and against the manifest's step:
    `check_position`), and its still encoded optimizer part.

    Optimizer tensors are stand-ins here (``read`` gives only their names), so a bad field is
    refused before any large tensor is loaded; without ``with_optimizer`` that part is left out
    and the optimizer file not opened.
    """
    source, files = directory / STATE_FILE, manifest["files"]
    if STATE_FILE not in files:
        raise CheckpointError(
            f"{directory / MANIFEST}: field 'files' does not list {STATE_FILE}. A checkpoint "
            "always has one; the manifest is corrupt or was edited. Use another checkpoint."
        )
    document = load_json(source)
    state_tensors = read(str(directory / STATE_TENSORS))[0] if STATE_TENSORS in files else {}
    optimizer_doc = document.pop("optimizer_states", None) if isinstance(document, dict) else None
    state = decode(document, state_tensors, source=str(source))
    if optimizer_doc is not None and with_optimizer:
        names = (
            read_safetensors_names(str(directory / OPTIMIZER_FILE))[0]
            if OPTIMIZER_FILE in files
            else {}
        )
        state["optimizer_states"] = decode(
            optimizer_doc, names, source=str(source), path="optimizer_states"
        )
    check_state(state, source=source)
    check_position(manifest, state, directory=directory)
    return state, optimizer_doc


def read_checkpoint(
    path: str | os.PathLike[str],
    *,
    device: str = "cpu",
    verify: bool = True,
    verified_elsewhere: Collection[str] = (),
) -> dict[str, Any]:
    """Verify (unless ``verify=False``) and load a checkpoint directory into one dict.

    The dict has ``"state_dict"`` (model weights), ``"optimizer_states"`` (if saved) and every
    key of ``state.json``. The manifest is checked before any file is read, and ``state.json``
    and the model index before any large tensor is loaded (`trainer.checkpoint.schema`).
    ``verified_elsewhere``: shard files another rank hashes (`trainer.checkpoint.rank_hashing`);
    their presence and size are still checked here, and this function never reads them.

    Raises:
        CheckpointError: a file is missing, unlisted, altered, or holds an invalid field (the
            message names the file, the field and the value).
    """
    directory = Path(path)
    manifest = check_listing(directory) if verify else read_manifest(directory)
    files = manifest["files"]
    with load_executor(files) as pool:
        # Hashed on worker threads while the tensors are read; nothing is returned unverified.
        # A tensor file read on the CPU is hashed from the tensors read (the bytes returned are
        # the bytes checked, read once); every other file from disk, starting now.
        is_hashed_on_read = str(device) == "cpu"
        futures = (
            start_hashing(
                pool,
                directory,
                manifest,
                [
                    n
                    for n in files
                    if not (is_hashed_on_read and _is_top_level_tensors(n))
                    and n not in verified_elsewhere
                ],
            )
            if verify
            else {}
        )

        def read(file: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            tensors, metadata = read_safetensors(file, device)
            name = Path(file).relative_to(directory).as_posix()
            if verify and is_hashed_on_read and name in files and name not in futures:
                algorithm = record_digest(files[name])[0]
                futures[name] = pool.submit(hash_read_tensors, file, tensors, algorithm)
            return tensors, metadata

        def check() -> None:
            if verify:
                check_hashes(
                    directory, manifest, futures, pool=pool, verified_elsewhere=verified_elsewhere
                )

        try:
            checkpoint, optimizer_doc = _read_state(directory, manifest, read)
            _model_tensors(directory, files, read_safetensors_names)  # the index, before shards
            optimizer_tensors = (
                read(str(directory / OPTIMIZER_FILE))[0] if OPTIMIZER_FILE in files else {}
            )
            model = _model_tensors(directory, files, read)
        except CheckpointError:  # an altered file is reported as such, before what it holds
            check()
            raise
        except Exception as err:  # a damaged file: report the integrity failure when that is why
            check()
            raise CheckpointError(f"checkpoint {directory} could not be read: {err}.") from err
        check()
    checkpoint["state_dict"] = model
    if optimizer_doc is not None:
        checkpoint["optimizer_states"] = decode(
            optimizer_doc,
            optimizer_tensors,
            source=str(directory / STATE_FILE),
            path="optimizer_states",
        )
    return checkpoint


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``state.json`` of a checkpoint directory, decoded and checked, without the optimizer
    states and the model: what a caller needs before the weights (the hyperparameters, the
    DataModule's state). The listing is checked and ``state.json`` and ``state.safetensors``
    are hashed before either is read; the tensor files are left to `read_checkpoint`.

    Raises:
        CheckpointError: as `read_checkpoint`, for the manifest and the files read here.
    """
    directory = Path(path)
    manifest = check_listing(directory)
    not_read = set(manifest["files"]) - {STATE_FILE, STATE_TENSORS}
    check_hashes(directory, manifest, {}, verified_elsewhere=not_read)  # hashed here
    try:
        state = _read_state(directory, manifest, read_safetensors, with_optimizer=False)[0]
    except CheckpointError:
        raise
    except Exception as err:  # safetensors' own error
        raise CheckpointError(f"checkpoint {directory} could not be read: {err}.") from err
    return state


def _is_top_level_tensors(name: str) -> bool:
    """Whether ``name`` (a manifest's file name) is one of our safetensors files."""
    return "/" not in name and name.endswith(".safetensors")


def find_latest_checkpoint(dirpath: str | os.PathLike[str]) -> Path | None:
    """The newest complete and valid checkpoint under ``dirpath`` (by the time its manifest was
    written, then by global step: the run written last, as Lightning's newest ``last``).

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
            (str(manifest.get("created", "")), int(manifest.get("global_step") or 0), entry)
        )
    for _, _, entry in sorted(candidates, reverse=True):
        try:
            verify_checkpoint(entry)
        except CheckpointError as err:
            warnings.warn(f"skipping corrupt or invalid checkpoint {entry}: {err}", stacklevel=2)
            continue
        return entry
    return None
