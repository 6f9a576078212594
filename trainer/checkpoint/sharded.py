"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP) shards inside the atomic directory.

Owns the save and load shared by the strategies whose state is split over ranks (FSDP,
Megatron). On save, every rank writes its shards into one staging folder beside the checkpoint;
rank 0 then moves that folder to ``<name>/dcp`` inside the atomic directory and writes the JSON
state and the manifest next to it (`agree_on_staging`, `commit_staged`; the background form,
with DCP's ``async_save``, is ``sharded_async.py`` and commits the same way). On load, every rank
verifies and reads the JSON state, then DCP fills the state dicts the strategy built for this rank.

Loading runs no code from the files, even when an attacker re-hashed the manifest. DCP keeps its
``.metadata`` as a pickle and unpickles byte items (non-tensor values: learning rates, ...) with
``torch.load(weights_only=False)``; `safe_storage_reader` replaces both reads. ``.metadata`` is
read with an allow-list unpickler that admits only DCP's own metadata dataclasses, ``torch.Size``,
dtypes and layouts, and ``pathlib`` paths; every shard path it names must stay inside the folder.
Byte items are read with ``torch.load(weights_only=True)`` first. (We keep DCP's own file rather
than writing a second, non-pickle metadata file, so checkpoints stay readable by plain DCP.)

Not owned: how a strategy shards its tensors or builds its state dicts (the strategy), the
directory format and atomic writes (``format.py``, ``atomic.py``). ``torch.distributed.checkpoint``
is imported on first use only, so ``import trainer`` does not load it.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from trainer.checkpoint.atomic import atomic_directory, process_tag, refusal_to_replace
from trainer.checkpoint.format import write_checkpoint_files
from trainer.checkpoint.paths import resolve_inside
from trainer.checkpoint.rank_hashing import hash_staged_share, read_checkpoint_by_shares
from trainer.checkpoint.safe_unpickle import load_weights_only, restricted_loads
from trainer.checkpoint.tensor_files import FileRecord
from trainer.errors import CheckpointError, describe

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader

__all__ = [
    "DCP_DIR",
    "ShardedStrategy",
    "agree_on_staging",
    "commit_staged",
    "has_sharded_state",
    "load_sharded_checkpoint",
    "safe_storage_reader",
    "save_sharded_checkpoint",
    "save_staged_checkpoint",
]

DCP_DIR = "dcp"


class ShardedStrategy(Protocol):
    """What the helpers use of a strategy: rank facts, collectives, its state dicts."""

    @property
    def world_size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def barrier(self) -> None: ...

    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]: ...

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...


def has_sharded_state(path: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint directory ``path`` holds DCP shards (else it is a full one)."""
    return (Path(path) / DCP_DIR).is_dir()


def save_sharded_checkpoint(
    strategy: ShardedStrategy, path: str | os.PathLike[str], checkpoint: dict[str, Any]
) -> None:
    """Write ``checkpoint`` to the directory ``path``: tensors as DCP shards, the rest as JSON.

    Every rank must call it. ``checkpoint["state_dict"]`` and ``checkpoint["optimizer_states"]``
    (default ``[]``) are this rank's sharded state dicts; every other key is written by rank 0
    with ``write_checkpoint_files``. An existing ``path`` is replaced atomically.

    Args:
        strategy: gives the collectives and ranks (broadcast, barrier, is_global_zero).
        path: the checkpoint directory to create or replace.
        checkpoint: the checkpoint dict; it is not modified.

    Raises:
        CheckpointError: on every rank, when ``path`` holds something that is not a checkpoint;
            on rank 0, when it could not create, write or rename the directory.
    """
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint.dcp_hashing import HashingFileSystemWriter

    rest = dict(checkpoint)
    tensors = {"model": rest.pop("state_dict"), "optimizers": rest.pop("optimizer_states", [])}

    def write_shards(staging: Path) -> dict[str, FileRecord]:
        writer = HashingFileSystemWriter(staging)
        dcp.save(tensors, storage_writer=writer)
        return writer.records

    save_staged_checkpoint(strategy, path, DCP_DIR, write_shards, rest)


def save_staged_checkpoint(
    strategy: ShardedStrategy,
    path: str | os.PathLike[str],
    subdir: str,
    write_shards: Callable[[Path], Mapping[str, FileRecord] | None],
    rest: dict[str, Any],
) -> None:
    """Every rank writes its shards to one staging folder; rank 0 commits it as ``path/subdir``.

    The staging folder is a hidden sibling of ``path`` (`agree_on_staging`), so a crash leaves
    nothing that looks like a checkpoint. Rank 0 then builds the checkpoint in an atomic
    directory (`commit_staged`). Every rank must call it.

    Args:
        strategy: gives the collectives and ranks (broadcast, barrier, is_global_zero).
        path: the checkpoint directory to create or replace.
        subdir: the name of the shards' folder inside the checkpoint.
        write_shards: called on every rank with the staging folder; writes that rank's shards
            and returns the manifest records of the files it hashed while writing them (by name
            relative to the staging folder), or None; the files nobody recorded are hashed after.
        rest: what rank 0 writes next to the shards (``write_checkpoint_files``).

    Raises:
        CheckpointError: on every rank, when ``path`` holds something that is not a checkpoint;
            on rank 0, when it could not create, write or rename the directory.
    """
    final = Path(path)
    staging = agree_on_staging(strategy, final, subdir)
    written = write_shards(staging)
    strategy.barrier()
    records = hash_staged_share(strategy, staging, subdir, written=written)
    if strategy.is_global_zero:
        commit_staged(
            final, staging, subdir, rest, world_size=strategy.world_size, known_records=records
        )
    strategy.barrier()


def agree_on_staging(
    strategy: ShardedStrategy,
    final: Path,
    subdir: str,
    check: Callable[[], str | None] | None = None,
) -> Path:
    """The staging folder every rank writes its shards to, named by rank 0 (a collective).

    It is a hidden sibling of ``final``, ``.<name>.<subdir>.tmp-<pid>-<host>-<id>`` after rank 0's
    process, so `trainer.checkpoint.atomic.remove_stale_temporaries` removes it once that process
    is gone (a killed save). One broadcast carries the name and whether rank 0 may write at
    ``final`` (its parent can be created, nothing else is there; and ``check``'s refusal, run
    on rank 0), so a refusal is raised on every rank instead of leaving the others waiting in a
    collective (an engine's own barrier, say).

    Raises:
        CheckpointError: on every rank, when ``final`` holds something that is not a checkpoint
            or ``check`` returned a reason.
    """
    proposal = None
    if strategy.is_global_zero:
        refusal = (
            refusal_to_replace(final)
            or _refusal_to_create(final)
            or (check() if check is not None else None)
        )
        proposal = (f".{final.name}.{subdir}.tmp-{process_tag()}", refusal)
    name, refusal = strategy.broadcast(proposal)
    if refusal is not None:
        raise CheckpointError(refusal)
    return final.parent / name


def _refusal_to_create(final: Path) -> str | None:
    """Why checkpoint ``final`` cannot be made (its parent cannot be created), or None."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create checkpoint {final}: {err}. Check the path and its permissions."
    return None


def commit_staged(
    final: Path,
    staging: Path,
    subdir: str,
    rest: dict[str, Any],
    *,
    world_size: int,
    known_records: Mapping[str, dict[str, Any]] | None = None,
) -> None:
    """On rank 0, once every rank's shards are in ``staging``: make the checkpoint ``final``.

    ``staging`` is moved into an atomic directory as ``subdir``, ``rest`` is written next to it
    (``write_checkpoint_files``: JSON, tensor files, and the manifest over every file, shards
    included; ``known_records``: shard records the ranks computed, `hash_staged_share`), and
    the directory is renamed into place. ``staging`` is gone afterwards, whatever happened.

    Raises:
        CheckpointError: the directory could not be created, written or renamed; an earlier
            checkpoint at ``final`` is intact.
    """
    try:
        with atomic_directory(final) as directory:
            os.rename(staging, directory / subdir)
            write_checkpoint_files(
                directory, rest, world_size=world_size, known_records=known_records
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_sharded_checkpoint(
    strategy: ShardedStrategy,
    path: str | os.PathLike[str],
    module: torch.nn.Module | None,
    optimizers: Iterable[torch.optim.Optimizer],
) -> dict[str, Any]:
    """Verify and read the checkpoint at ``path``, loading its DCP shards into this rank's state.

    Args:
        strategy: builds the sharded state dicts that DCP fills in place.
        path: a checkpoint directory written by `save_sharded_checkpoint`.
        module: the prepared (sharded) model; None raises.
        optimizers: the prepared optimizers, in the order they were saved.

    Returns:
        The checkpoint dict, with ``state_dict`` and ``optimizer_states`` as this rank's loaded
        sharded state dicts.

    Raises:
        CheckpointError: the directory fails verification, or ``module`` is None.
    """
    import torch.distributed.checkpoint as dcp

    directory = Path(path)
    # Each rank hashes its share of the shards; the ranks agree before DCP reads any.
    checkpoint = read_checkpoint_by_shares(strategy, directory, DCP_DIR)
    if module is None:
        raise CheckpointError(
            f"{directory}: a sharded checkpoint is loaded into a prepared model; prepare it first."
        )
    target = {
        "model": strategy.module_state_dict(module, full=False),
        "optimizers": [strategy.optimizer_state_dict(opt) for opt in optimizers],
    }
    read_dcp_metadata(directory / DCP_DIR / ".metadata")  # refused here, before DCP's fallbacks
    try:
        dcp.load(target, storage_reader=safe_storage_reader(directory / DCP_DIR))
    except dcp.api.CheckpointException as err:  # a BaseException that wraps each rank's error
        raise _unwrapped(err, directory) from None
    checkpoint["state_dict"] = target["model"]
    checkpoint["optimizer_states"] = target["optimizers"]
    return checkpoint


def _unwrapped(error: BaseException, directory: Path) -> CheckpointError:
    """Our own refusal from inside DCP's per-rank wrapper, or a CheckpointError that quotes it."""
    failures = getattr(error, "failures", {}) or {}
    for rank in sorted(failures):
        exception = failures[rank][0]
        if isinstance(exception, CheckpointError):
            return exception
    return CheckpointError(
        f"{directory / DCP_DIR}: torch.distributed.checkpoint could not load the shards into "
        f"this run's state: {str(error).strip().splitlines()[-1][:300]}. Resume with the same "
        "model, optimizers and number of processes, or consolidate the checkpoint first."
    )


# ---- reading DCP's files without running code ----------------------------------------------
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.serialization": ("_get_layout",),  # looks a layout up by name
    "torch": ("Size",),
    "pathlib": ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"),
    "pathlib._local": ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"),  # 3.13
    "collections": ("OrderedDict",),
    "builtins": ("set", "frozenset"),
}  # fmt: skip


def _metadata_global(module: str, name: str) -> object | None:
    """What ``.metadata`` may name: DCP's dataclasses, torch.Size, a dtype, a path; else None."""
    import importlib

    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)  # dtypes pickle as the global torch.<name>
    if name not in _METADATA_CLASSES.get(module, ()):
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def read_dcp_metadata(path: Path) -> Any:
    """DCP's ``Metadata`` from the pickle at ``path``, unpickled with the allow-list above.

    Raises:
        CheckpointError: the file names any other global, is not DCP metadata, or names a shard
            file outside its folder.
    """
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read DCP metadata {path}: {err}.") from err
    metadata = restricted_loads(data, source=path, allow=_metadata_global)
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(
            f"{path}: expected DCP's Metadata with a storage_data dict, received "
            f"{describe(metadata)}. The shards' folder is corrupt; use another checkpoint."
        )
    for info in metadata.storage_data.values():
        if not isinstance(info, _StorageInfo):
            raise CheckpointError(
                f"{path}, field 'storage_data': expected _StorageInfo entries, received "
                f"{describe(info)}. The shards' folder is corrupt; use another checkpoint."
            )
        resolve_inside(path.parent, info.relative_path, source=path, field="relative_path")
    return metadata


def safe_storage_reader(dcp_dir: str | os.PathLike[str]) -> FileSystemReader:
    """A ``FileSystemReader`` for ``dcp_dir`` that runs no code from the files it reads.

    Pass it to ``dcp.load(..., storage_reader=...)`` (or to any DCP loader that takes one) in
    place of a plain ``FileSystemReader`` or ``checkpoint_id``.

    Raises (from the load):
        CheckpointError: ``.metadata`` or a byte item names a global outside its allow-list
            (it could run code), or a shard path leaves the folder.
    """
    from torch.distributed.checkpoint import FileSystemReader

    class _SafeFileSystemReader(FileSystemReader):
        refusal: CheckpointError | None = None

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = Path(self._get_metadata_path(kwargs.get("rank")))
            if self.refusal is not None and not path.exists():
                raise self.refusal  # DCP swallows the first error and asks for a rank's file
            try:
                metadata = read_dcp_metadata(path)
            except CheckpointError as err:
                self.refusal = err
                raise
            if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader does
                from torch.distributed.checkpoint.metadata import StorageMeta

                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            return super().read_data(plan, _WeightsOnlyBytes(planner, self))

    return _SafeFileSystemReader(dcp_dir)


class _WeightsOnlyBytes:
    """The planner, except that byte items are unpickled with ``weights_only=True`` first.

    DCP's planners read byte items with ``torch.load(weights_only=False)``; this one hands them
    a fresh ``torch.save`` of the value it read safely, so they never see the file's bytes.
    """

    def __init__(self, planner: Any, reader: FileSystemReader) -> None:
        self._planner = planner
        self._reader = reader

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        info = self._reader.storage_data[read_item.storage_index]
        source = (
            f"{Path(self._reader.path) / info.relative_path} (item {read_item.dest_index.fqn!r})"
        )
        loaded = load_weights_only(value, source=source)
        clean = io.BytesIO()
        torch.save(loaded, clean)
        clean.seek(0)
        self._planner.load_bytes(read_item, clean)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)
