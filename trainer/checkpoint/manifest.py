"""The manifest of a checkpoint directory: the files the format allows, and files checked against it.

This module owns the format's name and version, the names of the files a checkpoint may hold
(`is_format_file`), writing ``manifest.json`` over the files written (`record_present_files`,
`write_manifest`), reading and checking it (`read_manifest`), and checking the files it lists:
presence, no extras and sizes (`check_listing`), then digests (`start_hashing` on worker threads,
`check_hashes`). It does not read or write tensors or ``state.json`` (``format.py``), nor make a
directory appear atomically (``atomic.py``), nor compute digests (``tensor_files.py``).

Each file record names its digest's algorithm by its key (`record_digest`): ``sha256`` by
default, ``blake3`` when written with ``TRAINER_CHECKPOINT_DIGEST=blake3`` (format version 1
either way; both are read).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import os
import re
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.checkpoint.atomic import MANIFEST, MANIFEST_MAX_BYTES, read_small_file
from trainer.checkpoint.paths import refuse_links
from trainer.checkpoint.schema import check_manifest
from trainer.checkpoint.tensor_files import InlineExecutor, hash_bytes, hash_file
from trainer.errors import CheckpointError, CheckpointNotFoundError

__all__ = [
    "ENGINE_DIRS",
    "EXTRA_DIR",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MODEL_FILE",
    "MODEL_INDEX",
    "OPTIMIZER_FILE",
    "STATE_FILE",
    "STATE_TENSORS",
    "allowing_extra_files",
    "check_hashes",
    "check_listing",
    "check_position",
    "is_format_file",
    "list_files",
    "load_json",
    "read_manifest",
    "record_digest",
    "record_present_files",
    "start_hashing",
    "start_recording_present_files",
    "write_json",
    "write_manifest",
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
# Files an Accelerator's save_state pre hooks wrote (``register_save_state_pre_hook``): listed
# and hashed like every file, never read by this package (the load hook reads them). Accepted
# only inside `allowing_extra_files` (the Accelerator's load_state, `trainer checkpoint verify`,
# the write that moves them in): a Trainer checkpoint holding them is refused, as any file the
# format does not define.
EXTRA_DIR = "extra"
_EXTRA_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("extra", default=False)


@contextlib.contextmanager
def allowing_extra_files() -> Iterator[None]:
    """Inside, files under `EXTRA_DIR` are files of the format (this thread only)."""
    token = _EXTRA_ALLOWED.set(True)
    try:
        yield
    finally:
        _EXTRA_ALLOWED.reset(token)


def is_format_file(name: str) -> bool:
    """Whether ``name`` (relative, "/"-separated, as a manifest lists it) is a file of the format.

    At the top level: ``model.safetensors``, ``model-0000i-of-0000N.safetensors``,
    ``model.safetensors.index.json``, ``optimizer.safetensors``, ``state.json`` and
    ``state.safetensors``. Below it: any file inside one of `ENGINE_DIRS` (a sharded engine's
    shards, which only that engine's no-code reader opens) and, inside `allowing_extra_files`,
    inside `EXTRA_DIR` (a save hook's files, which only the user's load hook opens). Nothing else.

    Example:
        >>> is_format_file("model-00001-of-00003.safetensors"), is_format_file("optimizer.bin")
        (True, False)
    """
    parts = name.split("/")
    if any(part in ("", ".", "..") or "\\" in part for part in parts):
        return False  # only plain names: "dcp/../optimizer.bin" is not inside dcp/
    if len(parts) > 1:
        return parts[0] in ENGINE_DIRS or (parts[0] == EXTRA_DIR and _EXTRA_ALLOWED.get())
    return name in _TOP_LEVEL_FILES or _SHARD_RE.fullmatch(name) is not None


def list_files(directory: Path) -> list[str]:
    """Every file under ``directory`` (relative, "/"-separated), the manifest excluded."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if relative != MANIFEST:
                found.append(relative)
    return sorted(found)


# ---- writing -------------------------------------------------------------------------------------
def write_json(path: Path, text: str) -> dict[str, Any]:
    """Write ``text`` to ``path`` and fsync it; return its manifest record (size, digest)."""
    data = text.encode("utf-8")
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    return hash_bytes(data)


def record_present_files(directory: Path) -> dict[str, dict[str, Any]]:
    """The manifest records of the files already in ``directory`` (a sharded engine's shards).

    Raises:
        CheckpointError: one of them is not a file of the format (a manifest listing it would
            be refused on load).
    """
    return {name: hash_file(str(directory / name)) for name in _present_format_files(directory)}


def start_recording_present_files(
    pool: ThreadPoolExecutor | InlineExecutor, directory: Path, known: Collection[str] = ()
) -> dict[str, Future[dict[str, Any]]]:
    """`record_present_files` on ``pool``: the caller writes its own files while they hash.

    Files named in ``known`` (hashed already, by the ranks that wrote them) are checked as
    files of the format but not hashed again.

    Raises:
        CheckpointError: at once, as `record_present_files` does.
    """
    return {
        name: pool.submit(hash_file, str(directory / name))
        for name in _present_format_files(directory)
        if name not in known
    }


def _present_format_files(directory: Path) -> list[str]:
    """The files in ``directory``, refused unless each is a file of the format."""
    present = list_files(directory)
    for name in present:
        if not is_format_file(name):
            raise CheckpointError(
                f"cannot write checkpoint {directory}: it already holds {name}, which is not a "
                f"file of the checkpoint format (a sharded engine's files go under one of "
                f"{', '.join(f'{d}/' for d in ENGINE_DIRS)}; see trainer.checkpoint.format."
                "ENGINE_DIRS). A manifest listing it would be refused on load."
            )
    return present


def write_manifest(
    directory: Path,
    records: dict[str, dict[str, Any]],
    *,
    world_size: int,
    epoch: Any,
    global_step: Any,
) -> None:
    """Write ``manifest.json`` listing ``records``; written last, it makes the folder a checkpoint."""
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        "world_size": world_size,
        "epoch": epoch,
        "global_step": global_step,
        "files": dict(sorted(records.items())),
    }
    write_json(directory / MANIFEST, json.dumps(manifest, indent=1))


# ---- reading and checking ------------------------------------------------------------------------
def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed, checked manifest of a checkpoint directory (files not yet verified).

    The folder may hold no symbolic link and nothing but files and folders (`refuse_links`), the
    manifest at most `MANIFEST_MAX_BYTES`; every record is type- and range-checked
    (`trainer.checkpoint.schema.check_manifest`), every file name stays inside the folder, and
    every listed file is one the format defines (`is_format_file`).
    """
    directory = Path(path)
    manifest_path = directory / MANIFEST
    if not directory.exists():
        raise CheckpointNotFoundError(f"checkpoint {directory} does not exist.")
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory} is not a directory.")
    refuse_links(directory)
    if not manifest_path.is_file():
        raise CheckpointError(
            f"{directory} is not a trainer checkpoint: it has no {MANIFEST} (an unfinished or foreign directory)."
        )
    manifest = load_json(manifest_path, limit=MANIFEST_MAX_BYTES)
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


def load_json(path: Path, *, limit: int | None = None) -> Any:
    """A JSON file of a checkpoint; NaN and Infinity literals (never written) are refused.

    With ``limit``, a file over ``limit`` bytes or not a regular file is refused unread.
    """
    try:
        data = path.read_bytes() if limit is None else read_small_file(path, limit)
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path} is unreadable or corrupt: {err}.") from err


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"the literal {name} is not valid JSON")


def check_position(manifest: dict[str, Any], state: Any, *, directory: Path) -> None:
    """Refuse a manifest whose ``epoch`` or ``global_step`` is not ``state.json``'s.

    The manifest's copy ranks checkpoints for ``ckpt_path="last"`` without opening them
    (`trainer.checkpoint.format.find_latest_checkpoint`), but ``manifest.json`` is the one file
    no digest covers: an edited step would make an older checkpoint rank first. The newest by
    the manifest is verified before it is chosen, and verifying runs this check, so an edited
    one is skipped as corrupt. ``state`` is the decoded, hash-checked ``state.json``.

    Raises:
        CheckpointError: naming both files, the field and the two values.
    """
    document = state if isinstance(state, dict) else {}
    for field in ("epoch", "global_step"):
        recorded, saved = manifest.get(field), document.get(field)
        if recorded != saved or type(recorded) is not type(saved):
            raise CheckpointError(
                f"{directory / MANIFEST}: field {field!r} is {recorded!r} but {STATE_FILE} says "
                f"{saved!r}. The manifest was edited after saving (it ranks checkpoints for "
                "ckpt_path='last'); use another checkpoint, or re-save this one."
            )


def check_listing(directory: Path) -> dict[str, Any]:
    """The manifest, after checking presence, extras and sizes of the files (no reading)."""
    manifest = read_manifest(directory)
    expected: dict[str, dict[str, Any]] = manifest["files"]
    present = set(list_files(directory))
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


def record_digest(record: dict[str, Any]) -> tuple[str, str]:
    """``(algorithm, hex digest)`` of a checked manifest record.

    A record holds ``sha256`` (the default) or ``blake3`` (opt-in). A record holding both (a
    blake3 record edited by a tool that only knows ``sha256``) is checked against its
    ``sha256``: that is the one such a tool keeps up to date.
    """
    algorithm = "sha256" if "sha256" in record else "blake3"
    return algorithm, record[algorithm]


def start_hashing(
    pool: ThreadPoolExecutor | InlineExecutor,
    directory: Path,
    manifest: dict[str, Any],
    names: Iterable[str] | None = None,
) -> dict[str, Future[Any]]:
    """Hash the listed files ``names`` (default: all) on ``pool``, so the caller reads meanwhile.

    Each file is hashed with its record's algorithm (`record_digest`); the largest go first, so
    the last to finish is not a large file started late.
    """
    files = manifest["files"]
    chosen = sorted(files if names is None else names)
    futures = {
        name: pool.submit(hash_file, str(directory / name), record_digest(files[name])[0])
        for name in sorted(chosen, key=lambda name: -files[name]["size"])
    }
    return {name: futures[name] for name in chosen}


def check_hashes(
    directory: Path,
    manifest: dict[str, Any],
    futures: dict[str, Future[Any]],
    *,
    pool: ThreadPoolExecutor | InlineExecutor | None = None,
    verified_elsewhere: Collection[str] = (),
) -> None:
    """Wait for the digests in ``futures``; refuse the first listed file whose digest differs.

    A listed file without a future is hashed too (on ``pool`` when given, else here), except
    those in ``verified_elsewhere`` (another rank checks them; see `trainer.checkpoint.rank_hashing`).
    """
    files = {k: v for k, v in manifest["files"].items() if k not in verified_elsewhere}
    missing = [name for name in files if name not in futures]
    if pool is not None and missing:
        futures = {**futures, **start_hashing(pool, directory, manifest, missing)}
    for name in sorted(files):
        algorithm, expected = record_digest(files[name])
        future = futures.get(name)
        if future is None:
            record = hash_file(str(directory / name), algorithm)
        else:
            record = future.result()
        if record[algorithm] != expected:
            raise CheckpointError(
                f"checkpoint file {directory / name} does not match its {algorithm} in the manifest (corrupt or altered)."
            )
