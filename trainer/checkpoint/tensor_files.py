"""Write safetensors files while hashing them, and read them back: the one safetensors reader.

`write_safetensors` serialises tensors in the safetensors format itself (8-byte header
length, JSON header, raw bytes), writing each tensor's memory straight to the file while a second
thread feeds the same bytes to the hash — the hash costs little beyond the write. Files are
fsynced.

Digests: sha256 by default (DESIGN §6; about 2 GB/s, one core per file), or BLAKE3 with
``TRAINER_CHECKPOINT_DIGEST=blake3`` (the ``blake3`` package; about 7 GB/s per core, several
cores on one file). Both are cryptographic, so a manifest whose own hash is known pins every byte
of every file it lists. A record names its algorithm by its key: ``{"size": n, "sha256": hex}``
or ``{"size": n, "blake3": hex}``; either is read whatever the setting.

Reading, two ways, both here:

- whole files and memory-mapped tensors (`read_safetensors`, `read_safetensors_names`,
  `read_safetensors_tensors`) go through the ``safetensors`` library, which checks the header
  (refusing one over 100 MB) and the offsets;
- `parse_safetensors_header` reads the header itself, refusing one over 100 MiB or longer than
  the file, an unknown dtype, and offsets that do not match a tensor's shape or do not tile the
  rest of the file, as the library does;
  `read_tensor_into` then copies one tensor with ``readinto`` straight into its destination, so
  no file stays mapped (``trainer.big_modeling`` loads checkpoints tensor by tensor this way).

Does not own which files make a checkpoint nor whether a path may be read (``format``,
``paths``): callers confine paths before they get here.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.errors import CheckpointError, ConfigurationError, MissingDependencyError, describe

__all__ = [
    "DIGESTS",
    "DTYPE_CODES",
    "FileRecord",
    "Hasher",
    "SafetensorsEntry",
    "default_digest",
    "hash_bytes",
    "hash_file",
    "hash_read_tensors",
    "parse_safetensors_header",
    "read_safetensors",
    "read_safetensors_names",
    "read_safetensors_tensors",
    "read_tensor_into",
    "shard_tensors",
    "write_safetensors",
]

_MAX_HEADER = 100 * 2**20
# torch dtype -> safetensors dtype code, for writing and (reversed) for parsing headers
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}  # fmt: skip
if hasattr(torch, "float8_e4m3fn"):
    DTYPE_CODES[torch.float8_e4m3fn] = "F8_E4M3"
    DTYPE_CODES[torch.float8_e5m2] = "F8_E5M2"
_CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

_CHUNK = 16 * 1024 * 1024
SMALL_SAVE_BYTES = 1024 * 1024  # below: written and hashed on the saving thread (see Hasher)

FileRecord = dict[str, Any]  # {"size": int, "blake3" or "sha256": str}
DIGESTS = ("sha256", "blake3")  # the algorithms a manifest record may name, by its key


DIGEST_ENV = "TRAINER_CHECKPOINT_DIGEST"  # "sha256" (default) or "blake3"


def default_digest() -> str:
    """The algorithm new records use: ``$TRAINER_CHECKPOINT_DIGEST``, else ``"sha256"``.

    Raises:
        ConfigurationError: the variable names another algorithm.
        MissingDependencyError: it asks for ``blake3`` and the package is not installed.
    """
    algorithm = os.environ.get(DIGEST_ENV, "sha256").strip().lower() or "sha256"
    if algorithm not in DIGESTS:
        raise ConfigurationError(
            f"{DIGEST_ENV}={algorithm!r}: expected one of {list(DIGESTS)}. Unset it for sha256."
        )
    if algorithm == "blake3":
        _blake3_module(required=True)
    return algorithm


def _blake3_module(*, required: bool) -> Any:
    try:
        return importlib.import_module("blake3")
    except ImportError as err:
        if not required:
            return None
        raise MissingDependencyError(
            f"BLAKE3 digests (a manifest that records them, or {DIGEST_ENV}=blake3) need the "
            f"package 'blake3', which is not installed ({err}). Install it with: pip install blake3"
        ) from err


def _new_digest(algorithm: str) -> Any:
    """A hashlib-like object; BLAKE3 hashes each large update on several cores."""
    if algorithm == "blake3":
        blake3 = _blake3_module(required=True)
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    return hashlib.sha256()


def hash_bytes(data: bytes, algorithm: str | None = None) -> FileRecord:
    """The manifest record of a small in-memory file: its size and digest."""
    algorithm = algorithm or default_digest()
    digest = _new_digest(algorithm)
    digest.update(data)
    return {"size": len(data), algorithm: digest.hexdigest()}


class Hasher:
    """A digest of a byte stream, computed on a worker thread (both hashes release the GIL);
    with ``threaded=False`` on the caller's (a small file: a thread costs more to start)."""

    def __init__(self, algorithm: str, *, threaded: bool = True) -> None:
        self.digest = _new_digest(algorithm)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, daemon=True) if threaded else None
        if self._thread is not None:
            self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self.digest.update(chunk)

    def update(self, chunk: Any) -> None:
        if self._thread is None:
            self.digest.update(chunk)
        else:
            self._queue.put(chunk)

    def hexdigest(self) -> str:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        return self.digest.hexdigest()


class InlineExecutor:
    """What a save uses of ``ThreadPoolExecutor``, each job run when submitted (a small save:
    starting its threads cost more than its writes). A job's error is raised by ``result()``."""

    def submit(self, function: Callable[..., Any], /, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(function(*args))
        except Exception as error:  # given to the caller by result(), as a pool does
            future.set_exception(error)
        return future

    def __enter__(self) -> InlineExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def save_executor(directory: Path, *tensors: Any) -> ThreadPoolExecutor | InlineExecutor:
    """Threads for a save (its files written and hashed side by side), or `InlineExecutor` when
    its tensors total under `SMALL_SAVE_BYTES` and ``directory`` holds nothing to hash."""
    groups = [group.values() for group in tensors if isinstance(group, Mapping)]
    total = sum(_nbytes(value) for values in groups for value in values)
    return _executor(is_small=total < SMALL_SAVE_BYTES and not any(directory.iterdir()))


def load_executor(files: Mapping[str, Any]) -> ThreadPoolExecutor | InlineExecutor:
    """Threads for a load's hashes, or `InlineExecutor` when the manifest's ``files`` records
    total under `SMALL_SAVE_BYTES` (an unreadable size counts as large)."""
    sizes = [record.get("size") if isinstance(record, dict) else None for record in files.values()]
    return _executor(
        is_small=all(type(size) is int for size in sizes) and sum(sizes) < SMALL_SAVE_BYTES
    )


def _executor(*, is_small: bool) -> ThreadPoolExecutor | InlineExecutor:
    return InlineExecutor() if is_small else ThreadPoolExecutor(max_workers=4)


def _nbytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def write_safetensors(
    path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> FileRecord:
    """Write ``tensors`` to ``path`` as safetensors; return its manifest record (size, digest).

    Tensors must not share memory (call `deduplicate` first) and must have a supported dtype.
    The digest is `default_digest`'s, computed from the bytes as they are written.
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    order = sorted(tensors)
    for name in order:
        tensor = tensors[name]
        if tensor.dtype not in DTYPE_CODES:
            raise ValueError(f"safetensors cannot store dtype {tensor.dtype} ({name!r})")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": DTYPE_CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    prefix = len(header_bytes).to_bytes(8, "little") + header_bytes
    algorithm = default_digest()
    hasher = Hasher(algorithm, threaded=offset >= SMALL_SAVE_BYTES)
    with open(path, "wb") as file:
        file.write(prefix)
        hasher.update(prefix)
        for name in order:
            data = _tensor_bytes(tensors[name])
            for start in range(0, len(data), _CHUNK):
                chunk = data[start : start + _CHUNK]
                file.write(chunk)
                hasher.update(chunk)
        file.flush()
        os.fsync(file.fileno())
    return {"size": len(prefix) + offset, algorithm: hasher.hexdigest()}


def hash_file(path: str, algorithm: str | None = None) -> FileRecord:
    """Size and digest of a file (``algorithm`` one of `DIGESTS`; default `default_digest`).

    BLAKE3 hashes the file memory-mapped, on several cores; sha256 reads it in large chunks.
    """
    algorithm = algorithm or default_digest()
    digest = _new_digest(algorithm)
    if algorithm == "blake3":
        size = os.stat(path).st_size
        digest.update_mmap(path)
        return {"size": size, algorithm: digest.hexdigest()}
    size = 0
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, algorithm: digest.hexdigest()}


def read_safetensors(
    path: str, device: str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file (never unpickles)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device=device) as handle:
        metadata = handle.metadata() or {}
        return {name: handle.get_tensor(name) for name in handle.keys()}, metadata


def read_safetensors_names(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensor names of a safetensors file, each mapped to an empty stand-in, and its metadata.

    Only the header is read: enough to check what a checkpoint's JSON refers to before any
    tensor is loaded.
    """
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as handle:
        return dict.fromkeys(handle.keys(), _STAND_IN), handle.metadata() or {}


_STAND_IN = torch.empty(0)


def read_safetensors_tensors(path: str, keys: list[str]) -> list[torch.Tensor]:
    """The tensors ``keys`` of a safetensors file, in order, on the CPU and memory-mapped.

    The mapping lives only as long as the returned tensors do. A key listed twice is read twice.
    """
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as handle:
        return [handle.get_tensor(key) for key in keys]


@dataclass(frozen=True)
class SafetensorsEntry:
    """Where one tensor lies in a safetensors file, as its (checked) header says."""

    key: str  # its name in the file
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file


def parse_safetensors_header(path: Path) -> tuple[list[SafetensorsEntry], dict[str, str]]:
    """The tensors (key, dtype, shape, offset) and metadata of a safetensors file; no data read.

    Raises:
        CheckpointError: the file is missing, truncated or not safetensors, as the
            ``safetensors`` library judges it: its header is over 100 MiB or longer than the
            file, metadata is not strings, a dtype is unknown, a shape or offsets are not lists
            of non-negative integers, or a tensor's offsets do not match its shape, or its data
            overlap another's, leave a gap or do not end where the file ends.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if size < 8 or length > min(size - 8, _MAX_HEADER):
                raise ValueError(f"header length {length} does not fit a {size}-byte file")
            header = json.loads(file.read(length))
        if not isinstance(header, dict):
            raise ValueError(f"its header is a JSON {type(header).__name__}, not an object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError(f"'__metadata__' must map names to strings, not {describe(metadata)}")
        entries = [_entry(key, info, path, 8 + length) for key, info in header.items()]
        _check_tiling(entries, 8 + length, size)
    # RecursionError: JSON nested thousands deep
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file: {err}.") from err
    return entries, metadata


def _entry(key: str, info: Any, path: Path, start: int) -> SafetensorsEntry:
    """One header entry, checked; ``start`` is where the data section begins."""
    shape, offsets = info["shape"], info["data_offsets"]
    for field, value in (("shape", shape), ("data_offsets", offsets)):
        if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
            raise ValueError(
                f"tensor {key!r}: {field!r} must be a list of non-negative integers, "
                f"not {describe(value)}"
            )
    dtype = _CODE_DTYPES[info["dtype"]]
    if len(offsets) != 2 or offsets[1] - offsets[0] != dtype.itemsize * math.prod(shape):
        raise ValueError(f"tensor {key!r} has offsets {offsets} that do not match its shape")
    return SafetensorsEntry(key, path, dtype, tuple(shape), start + offsets[0])


def _check_tiling(entries: list[SafetensorsEntry], start: int, size: int) -> None:
    """The tensors' data follow one another from ``start`` to the end of the file, without gap
    or overlap, as the ``safetensors`` library requires (empty tensors may share an offset)."""
    covered = start
    for entry in sorted(entries, key=lambda e: (e.offset, math.prod(e.shape))):
        if entry.offset != covered:
            raise ValueError(
                f"tensor {entry.key!r} starts at data byte {entry.offset - start}, not "
                f"{covered - start}: tensors overlap or leave a gap"
            )
        covered += entry.dtype.itemsize * math.prod(entry.shape)
    if covered != size:
        raise ValueError(f"its tensors' data end at byte {covered} of a {size}-byte file")


def hash_read_tensors(
    path: str, tensors: dict[str, torch.Tensor], algorithm: str | None = None
) -> FileRecord:
    """Size and digest of the safetensors file ``path``, hashing ``tensors`` read from it.

    ``tensors`` is what `read_safetensors` returned for ``path`` on the CPU (memory-mapped by
    safetensors). The digest covers the file's header bytes, then each tensor's bytes in the
    order of their offsets, which tile the rest of the file: so it is the file's digest, computed
    over the very bytes the caller received, and it maps in the pages a later copy would fault.
    Where that does not hold (a tensor not on the CPU, a header whose tensors leave a gap or do
    not match them), the file itself is hashed (`hash_file`).
    """
    algorithm = algorithm or default_digest()
    try:
        entries, _ = parse_safetensors_header(Path(path))
    except CheckpointError:
        return hash_file(path, algorithm)
    entries.sort(key=lambda entry: entry.offset)
    with open(path, "rb", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(8)
        prefix = head + file.read(int.from_bytes(head, "little"))  # checked by the parse above
    start = len(prefix)
    views, end = [], start
    for entry in entries:
        tensor = tensors.get(entry.key)
        is_match = (
            tensor is not None
            and tensor.device.type == "cpu"
            and tensor.dtype == entry.dtype
            and tuple(tensor.shape) == entry.shape
            and tensor.is_contiguous()
            and entry.offset == end
        )
        if not is_match:
            return hash_file(path, algorithm)
        views.append(_tensor_bytes(tensor))
        end += len(views[-1])
    if end != size:
        return hash_file(path, algorithm)
    digest = _new_digest(algorithm)
    for data in (prefix, *views):
        digest.update(data)
    return {"size": size, algorithm: digest.hexdigest()}


def read_tensor_into(path: Path, offset: int, out: torch.Tensor, *, key: str) -> None:
    """Fill CPU, contiguous ``out`` with its bytes at ``offset`` of ``path`` (``readinto``).

    ``offset`` and ``out``'s size come from `parse_safetensors_header`, which checked them.

    Raises:
        CheckpointError: the file ends before ``out`` is full.
    """
    nbytes = out.numel() * out.element_size()
    if nbytes == 0:
        return
    view = memoryview(out.detach().reshape(-1).view(torch.uint8).numpy())
    with open(path, "rb", buffering=0) as file:
        file.seek(offset)
        done = 0
        while done < nbytes:  # read() returns at most ~2 GiB at a time
            count = file.readinto(view[done:])
            if not count:
                raise CheckpointError(f"{path} is truncated: {key!r} is incomplete.")
            done += count


def deduplicate(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that alias another (tied weights); return the rest and ``{alias: kept}``."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.device.type == "meta" or tensor.numel() == 0:
            kept[name] = tensor
            continue
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = tensor
    # Views into a larger shared storage that are not identical are written as copies.
    return kept, aliases


def shard_tensors(
    tensors: dict[str, torch.Tensor], max_shard_bytes: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Split ``tensors`` (in name order) into groups of at most ``max_shard_bytes`` each."""
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shard and size + nbytes > max_shard_bytes:
            yield shard
            shard, size = {}, 0
        shard[name] = tensors[name]
        size += nbytes
    if shard or not tensors:
        yield shard
