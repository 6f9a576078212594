"""Sharded checkpoints written in the background: DCP's ``async_save``, then the usual commit.

Owns the background form of `trainer.checkpoint.sharded.save_sharded_checkpoint`. On the
training thread, every rank agrees on the staging folder (the same collective as a synchronous
save), copies its shards of the state to host memory with DCP's stager, and starts
``torch.distributed.checkpoint.async_save`` into the staging folder; training then goes on. On a
background thread, every rank waits for DCP's write, the ranks agree that every one succeeded,
rank 0 commits the checkpoint exactly as a synchronous save does (`commit_staged`: shards moved
into an atomic directory, JSON state, manifest with every file's digest, rename), and rank 0 tells
the others whether it did. So a checkpoint appears under its name only when complete on every
rank, and every rank learns of a failure.

The background collectives run on a process group of their own (``process_group``, gloo), never
on the one training uses: two threads issuing collectives on one group could pair them up
differently on different ranks.

Not owned: when to save, the thread that waits, and what runs once a save is complete
(``trainer.plugins.AsyncCheckpointIO``); the directory format and loading (``sharded.py``,
``format.py``), which are those of a synchronous sharded save.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint.codec import encode
from trainer.checkpoint.sharded import DCP_DIR, ShardedStrategy, agree_on_staging, commit_staged
from trainer.checkpoint.tensor_files import FileRecord
from trainer.errors import CheckpointError, TrainerError

if TYPE_CHECKING:
    import os

    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.staging import AsyncStager

    from trainer.checkpoint.dcp_hashing import HashingFileSystemWriter

__all__ = [
    "AsyncShardedSave",
    "PassThroughStager",
    "broadcast_failure",
    "gather_outcomes",
    "start_async_sharded_save",
    "write_and_commit",
]


@dataclasses.dataclass
class _Destination:
    """One directory the staged state is written to, and its agreed staging folder."""

    final: Path
    staging: Path


class PassThroughStager:
    """An ``AsyncStager`` for a state dict that is already a private copy: nothing to copy again.

    ``async_save`` receives the dict `start_async_sharded_save` staged itself (the same copy also
    serves a second destination, ``last``).
    """

    _synchronize_after_execute = False

    @property
    def should_synchronize_after_execute(self) -> bool:
        """Staging is finished before ``async_save`` is called: nothing to wait for."""
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Return ``state_dict`` itself."""
        return state_dict

    def synchronize_staging(self) -> None:
        """Nothing is staged asynchronously."""

    def close(self) -> None:
        """Nothing is held."""


class AsyncShardedSave:
    """One sharded checkpoint written in the background, on every rank.

    Made by `start_async_sharded_save`. `add_destination` (training thread, every rank, a
    collective) writes the same copy to another directory too; `write` (background thread, every
    rank, each destination once and in order) finishes one destination.

    Attributes:
        destinations: the checkpoint directories, in the order they are written.
    """

    def __init__(
        self,
        strategy: ShardedStrategy,
        *,
        tensors: dict[str, Any],
        rest: dict[str, Any],
        process_group: ProcessGroup,
        first: _Destination,
        upload: concurrent.futures.Future[Any],
        writer: HashingFileSystemWriter,
    ) -> None:
        self._strategy = strategy
        self._is_zero = strategy.is_global_zero
        self._world_size = strategy.world_size
        self._tensors = tensors  # this rank's staged shards
        self._rest = rest  # rank 0's staged JSON state (empty elsewhere: only rank 0 writes it)
        self._group = process_group
        self._destinations = [first]
        self._upload = upload
        self._writer = writer  # the first destination's: its records once the upload is done

    @property
    def destinations(self) -> list[Path]:
        """The checkpoint directories, in the order they are written."""
        return [destination.final for destination in self._destinations]

    def add_destination(self, path: str | os.PathLike[str]) -> int:
        """Write the same copy to ``path`` as well (ModelCheckpoint's ``last``); its index.

        Every rank must call it, on the training thread (it agrees on the staging folder).

        Raises:
            CheckpointError: on every rank, when ``path`` holds something that is not a checkpoint.
        """
        final = Path(path)
        staging = agree_on_staging(self._strategy, final, DCP_DIR)
        self._destinations.append(_Destination(final, staging))
        return len(self._destinations) - 1

    def write(self, index: int) -> None:
        """On the background thread: write destination ``index`` and commit it (every rank).

        The first destination's shards are DCP's ``async_save``; a further one is a ``dcp.save``
        of the same copy. Then the ranks agree that all wrote their shards, rank 0 commits, and
        every rank learns whether it did.

        Raises:
            CheckpointError: on every rank, when any rank's shards or rank 0's commit failed,
                with each cause (the caller names the checkpoint).
        """
        import torch.distributed.checkpoint as dcp

        from trainer.checkpoint.dcp_hashing import HashingFileSystemWriter

        destination = self._destinations[index]

        def write_shards() -> dict[str, FileRecord]:
            if index == 0:
                self._upload.result()
                return self._writer.records
            writer = HashingFileSystemWriter(destination.staging)
            dcp.save(self._tensors, storage_writer=writer, process_group=self._group)
            return writer.records

        def commit(written: dict[str, FileRecord]) -> None:
            commit_staged(
                destination.final, destination.staging, DCP_DIR, self._rest,
                world_size=self._world_size,
                known_records={f"{DCP_DIR}/{name}": record for name, record in written.items()},
            )  # fmt: skip

        write_and_commit(
            self._group, self._world_size, self._is_zero, write=write_shards, commit=commit,
            staging=destination.staging, what="shards",
        )  # fmt: skip


def write_and_commit(
    group: Any,
    world_size: int,
    is_zero: bool,
    *,
    write: Callable[[], Mapping[str, FileRecord] | None],
    commit: Callable[[dict[str, FileRecord]], None],
    staging: Path,
    what: str,
) -> None:
    """A background sharded write on every process: write, agree, process 0 commits, agree.

    Each process runs ``write`` (its own files into ``staging``; it returns the manifest records
    of the files it hashed while writing them, or None); the processes all-gather how it went,
    and those records, on ``group`` (the checkpoint group, never training's); process 0 then
    runs ``commit`` with every process's records (``is_zero``: this is process 0) if every
    process wrote, or removes ``staging`` if any failed; last, every process learns whether the
    commit happened.

    Raises:
        CheckpointError: on every process, when any process's ``what`` (its files) or process
            0's commit failed, with each cause (the caller names the checkpoint).
    """
    error: BaseException | None = None
    written: Mapping[str, FileRecord] | None = None
    try:
        written = write()
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        error = err
    failures, records = gather_outcomes(
        group, world_size, _describe(error) if error is not None else None, written
    )
    if failures and error is None:
        error = CheckpointError(f"another process could not write its {what}: {failures[0]}")
    if is_zero:
        if error is None:
            try:
                commit(records)
            except BaseException as err:
                error = err
        else:
            shutil.rmtree(staging, ignore_errors=True)
    committed = broadcast_failure(
        group, world_size, _describe(error) if error is not None else None
    )
    if error is None and committed is not None:
        error = CheckpointError(f"process 0 could not commit it: {committed}")
    if isinstance(error, KeyboardInterrupt | SystemExit):
        raise error
    if error is not None:
        raise CheckpointError(_describe(error)) from error


def gather_outcomes(
    group: Any, world_size: int, failure: str | None, written: Mapping[str, FileRecord] | None
) -> tuple[list[str], dict[str, FileRecord]]:
    """Every process's failure, if any, as ``"process R: ..."``, and every process's records of
    the files it wrote (one all-gather on ``group``, the checkpoint group: never training's)."""
    import torch.distributed as dist

    outcomes: list[Any] = [(failure, dict(written or {}))]
    if world_size > 1:
        outcomes = [None] * world_size
        dist.all_gather_object(outcomes, (failure, dict(written or {})), group=group)
    records: dict[str, FileRecord] = {}
    for _, part in outcomes:
        records.update(part)
    failures = [f"process {rank}: {item}" for rank, (item, _) in enumerate(outcomes) if item]
    return failures, records


def broadcast_failure(group: Any, world_size: int, failure: str | None) -> str | None:
    """Process 0's commit failure, if any, on every process (one broadcast on ``group``)."""
    import torch.distributed as dist

    if world_size == 1:
        return failure
    box = [failure]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]


def start_async_sharded_save(
    strategy: ShardedStrategy,
    path: str | os.PathLike[str],
    checkpoint: dict[str, Any],
    *,
    process_group: ProcessGroup,
    stager: AsyncStager,
) -> AsyncShardedSave:
    """Copy this rank's state and start writing it as a sharded checkpoint at ``path``.

    Every rank must call it, on the training thread, at the same point. When it returns the
    state is copied (``stager``): training may change the tensors, the checkpoint holds those
    of this moment. ``checkpoint["state_dict"]`` and ``checkpoint["optimizer_states"]`` are this
    rank's sharded state dicts (DCP shards); the rest is rank 0's JSON state, as for
    `trainer.checkpoint.sharded.save_sharded_checkpoint`. Finish it with
    `AsyncShardedSave.write` on a background thread.

    Args:
        strategy: gives the ranks and the collectives of the training thread.
        path: the checkpoint directory to create or replace.
        checkpoint: the checkpoint dict; it is not modified.
        process_group: the group DCP and the background agreement use (gloo; not training's).
        stager: copies the state to host memory (``DefaultStager``; pinned memory on CUDA).

    Returns:
        The save in flight; its first destination is ``path``.

    Raises:
        CheckpointError: on every rank, when ``path`` holds something that is not a checkpoint
            or a value outside the tensors cannot be stored (the message names where it is).
    """
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint.dcp_hashing import HashingFileSystemWriter

    rest = dict(checkpoint)
    tensors = {"model": rest.pop("state_dict"), "optimizers": rest.pop("optimizer_states", [])}
    final = Path(path)
    staging = agree_on_staging(strategy, final, DCP_DIR, check=lambda: _refusal_to_store(rest))
    # One staging call per save: torch 2.11's DefaultStager cannot stage twice (pytorch#183413).
    both = stager.stage({"tensors": tensors, "rest": rest if strategy.is_global_zero else {}})
    if isinstance(both, concurrent.futures.Future):  # a stager that copies in the background
        both = both.result()
    staged, staged_rest = both["tensors"], both["rest"]
    writer = HashingFileSystemWriter(staging)
    upload = dcp.async_save(
        staged, storage_writer=writer, process_group=process_group, async_stager=PassThroughStager()
    )
    if not isinstance(upload, concurrent.futures.Future):  # an AsyncSaveResponse (torch >= 2.9)
        upload = upload.upload_completion
    return AsyncShardedSave(
        strategy, tensors=staged, rest=staged_rest, process_group=process_group,
        first=_Destination(final, staging), upload=upload, writer=writer,
    )  # fmt: skip


def _refusal_to_store(rest: dict[str, Any]) -> str | None:
    """Why ``rest`` cannot be written as JSON (naming where), or None: checked before any copy."""
    try:
        encode(rest, {}, "state")
    except CheckpointError as err:
        return str(err)
    return None


def _describe(error: BaseException) -> str:
    """One line for ``error``; DCP's per-rank wrapper is opened to show each rank's cause."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(
            f"process {rank}: {type(item[0]).__name__}: {item[0]}"
            for rank, item in sorted(failures.items())
        )
    if isinstance(error, TrainerError):  # ours already says what and where
        return str(error)
    return f"{type(error).__name__}: {error}"
