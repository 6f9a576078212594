"""Checkpoints copied off the device at the step boundary and written on a background thread.

This module owns the one writer thread, the one save in flight (`PendingSave`), and running on the
training thread what has to wait until a save is complete (a ModelCheckpoint's rotation and
``last`` swap). The copy of the state it writes is `trainer.plugins.async_snapshot`'s (every
tensor copied to host memory, pinned on CUDA; re-exported here).
It does not own the file format, hashing, fsync or the atomic rename: the background thread calls
the same `trainer.checkpoint.write_checkpoint` as a synchronous save, or, for a strategy whose
every rank writes shards (FSDP's SHARDED state dicts), finishes the sharded save that
`trainer.plugins.async_sharded` started with DCP's ``async_save``. Nor does it decide when or what
to save (``ModelCheckpoint``) or where the loop checks on the save (``trainer/trainer/trainer.py``).

The guarantees of a synchronous save hold (DESIGN §6, docs/checkpointing.md "Asynchronous saves"):
a checkpoint appears under its name only when complete; it holds the state of its own step; at
most one save is in flight (the next one waits, and the time it waited is recorded); a failure is
raised on the training thread, naming the checkpoint; ``fit`` returns only once the last save is
complete.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from trainer.checkpoint.format import write_checkpoint
from trainer.errors import CheckpointError
from trainer.plugins.async_sharded import ShardedSaves, saves_sharded
from trainer.plugins.async_snapshot import Snapshot, snapshot_checkpoint

if TYPE_CHECKING:
    import os

    from trainer.strategies import Strategy
    from trainer.trainer.trainer import Trainer

__all__ = [
    "AsyncCheckpointIO",
    "PendingSave",
    "Snapshot",
    "Writer",
    "find_checkpoint_io",
    "snapshot_checkpoint",
]

_log = logging.getLogger(__name__)
_THREAD_NAME = "trainer-async-checkpoint"


class Writer(Protocol):
    """What a `PendingSave` writes with: the jobs for the writer thread, and the memory after."""

    def prepare(self, path: Path) -> Callable[[], None]:
        """On the training thread: the job that writes to ``path`` on the writer thread."""
        ...

    def release(self) -> list[torch.Tensor]:
        """Once every job ended: host tensors the next snapshot may reuse."""
        ...


class _SnapshotWriter:
    """Process 0 writes a whole-state `Snapshot` with the synchronous writer (single, DDP, FULL)."""

    def __init__(self, snapshot: Snapshot, world_size: int) -> None:
        self._snapshot = snapshot
        self._world_size = world_size

    def prepare(self, path: Path) -> Callable[[], None]:
        return functools.partial(self._write, path)

    def _write(self, path: Path) -> None:
        for event in self._snapshot.events:  # the device-to-host copies
            event.synchronize()
        write_checkpoint(path, self._snapshot.checkpoint, world_size=self._world_size)

    def release(self) -> list[torch.Tensor]:
        return self._snapshot.buffers


class PendingSave:
    """One checkpoint written in the background: where it goes, and what runs once it is there.

    ``Trainer.save_checkpoint`` returns one when an `AsyncCheckpointIO` is in use (None when the
    save was synchronous). It is complete when every destination is written and renamed into
    place; then the functions given to `then` run, in order, on the training thread (at the next
    step boundary, the next save, or the end of ``fit``). If the write fails, they never run and
    the failure is raised there instead.

    Attributes:
        path: the checkpoint directory being written.
        paths: every destination of this snapshot (``path``, then those of `also_write`).
    """

    def __init__(self, io: AsyncCheckpointIO, path: Path, writer: Writer | None) -> None:
        self.path = path
        self.paths = [path]
        self._io = io
        self._writer = writer  # None on a process that writes nothing (not process 0 under DDP)
        self._is_writer = writer is not None
        self._futures: list[concurrent.futures.Future[None]] = []
        self._continuations: list[Callable[[], None]] = []
        self._error: BaseException | None = None  # set by the writer thread
        self._failed_path: Path | None = None
        self._is_finished = writer is None  # written and its continuations run (or failed)

    @property
    def is_complete(self) -> bool:
        """Whether the checkpoint is on disk and what waited for it has run."""
        return self._is_finished and self._error is None

    @property
    def has_ended(self) -> bool:
        """Whether the background write has ended, written or failed (nothing run yet)."""
        return self._is_finished or self._is_written()

    def then(self, function: Callable[[], None]) -> None:
        """Run ``function`` on the training thread once the checkpoint is complete (now if it is)."""
        if self._is_finished:
            if self._error is None:
                function()
            return
        self._continuations.append(function)

    def also_write(self, path: str | os.PathLike[str]) -> None:
        """Write the same snapshot to a second directory too (ModelCheckpoint's ``last``).

        It belongs to this save: complete when both are, from one copy of the state.

        Raises:
            CheckpointError: the save is already complete (its copy of the state is released),
                or, for a sharded save (every process calls it then), ``path`` holds something
                that is not a checkpoint.
        """
        path = Path(path)
        if self._is_writer and self._is_finished:
            raise CheckpointError(
                f"PendingSave.also_write({str(path)!r}): the save of {self.path} is already "
                "complete and its copy of the state released. Call also_write right after "
                "save_checkpoint, before the next step boundary."
            )
        self.paths.append(path)
        if self._writer is not None:  # sharded: every process agrees on its staging folder here
            self._futures.append(self._io._submit(self, path, self._writer.prepare(path)))

    def wait(self) -> None:
        """Block until complete; then run what waited for it.

        Raises:
            CheckpointError: the background write failed (raised once, by the first wait).
        """
        if not self._is_finished:
            self._io._wait_for(self)

    # ---- the writer thread ----------------------------------------------------------------
    def _run(self, path: Path, job: Callable[[], None]) -> None:
        """On the writer thread: write one destination, unless an earlier one failed."""
        if self._error is not None:
            return
        try:
            job()
        except BaseException as err:  # kept for the training thread, which raises it
            self._error, self._failed_path = err, path

    def _is_written(self) -> bool:
        return all(future.done() for future in self._futures)


class AsyncCheckpointIO:
    """Write checkpoints in the background: ``Trainer(plugins=[AsyncCheckpointIO()])``.

    At the step boundary the checkpoint is copied to host memory (every tensor; pinned memory
    and an asynchronous copy on CUDA), so training can go on at once and cannot change what is
    written. One background thread then writes it with the synchronous path's writer (same
    files, sha256, fsync, atomic rename). At most one save is in flight: a new one first waits
    for the previous. Extra host memory: one copy of the checkpoint's tensors.

    Under FSDP's SHARDED state dicts every process copies its own shards and writes them with
    ``torch.distributed.checkpoint.async_save``; process 0 commits the checkpoint (manifest,
    digests, rename) once every process wrote its part (`trainer.plugins.async_sharded`).

    A save runs in the background only while ``fit`` runs; elsewhere (after ``fit``, in
    ``on_exception``) it is synchronous. Strategies that write through their own engine
    (DeepSpeed, Megatron, XLA) save synchronously, with a warning the first time.

    Attributes:
        last_wait_s: seconds the latest save waited for the one before it.
        total_wait_s: seconds the training thread waited for background writes (the end of
            ``fit`` included).
        last_snapshot_s: seconds the latest snapshot (the copy off the device) took.
        save_count: background saves started.

    Examples:
        >>> trainer = Trainer(plugins=[AsyncCheckpointIO()], callbacks=[ModelCheckpoint(
        ...     every_n_train_steps=500, save_last=True)])
        >>> trainer.fit(module, loader)  # returns once the last checkpoint is complete
        >>> trainer.checkpoint_io.total_wait_s
        0.0
    """

    def __init__(self) -> None:
        self.last_wait_s = 0.0
        self.total_wait_s = 0.0
        self.last_snapshot_s = 0.0
        self.save_count = 0
        self._in_flight: PendingSave | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._waited = 0.0  # since the latest save started
        self._spare: list[torch.Tensor] = []  # the last snapshot's host memory, once written
        self._sharded = ShardedSaves()  # the group and stager of sharded saves, during a stage
        self._warned: set[str] = set()

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        *,
        strategy: Strategy,
        in_background: bool = True,
    ) -> PendingSave | None:
        """Snapshot ``checkpoint`` and write it to ``path`` in the background.

        Returns:
            The `PendingSave`, or None when it was written synchronously (``in_background``
            False, or a strategy that writes its own files).

        Raises:
            CheckpointError: a value cannot be stored (raised here, naming where it is), or the
                previous background save failed.
        """
        self.wait()  # at most one in flight
        is_sharded = saves_sharded(strategy)
        if not in_background or not (is_sharded or _writes_with_common_writer(strategy)):
            if in_background:
                self._warn_synchronous(strategy)
            strategy.save_checkpoint(path, checkpoint)
            return None
        self.last_wait_s, self._waited = self._waited, 0.0
        if not is_sharded and not strategy.is_global_zero:  # as synchronously: process 0 writes
            return PendingSave(self, Path(path), None)
        start = time.perf_counter()
        writer: Writer
        if is_sharded:  # every process copies and writes its shards
            writer = self._sharded.start(strategy, path, checkpoint)
        else:
            writer = _SnapshotWriter(
                snapshot_checkpoint(checkpoint, spare=self._spare), strategy.world_size
            )
            self._spare = []  # those not reused are freed
        self.last_snapshot_s = time.perf_counter() - start
        pending = PendingSave(self, Path(path), writer)
        self._in_flight = pending
        pending._futures.append(self._submit(pending, pending.path, writer.prepare(pending.path)))
        self.save_count += 1
        _log.debug(
            "checkpoint %s: snapshot in %.3f s, written in the background (waited %.3f s for "
            "the previous save)",
            path,
            self.last_snapshot_s,
            self.last_wait_s,
        )
        return pending

    def poll(self) -> None:
        """At a step boundary: if the save in flight is written, finish it (never blocks).

        Raises:
            CheckpointError: the background write failed; the message names the checkpoint.
        """
        pending = self._in_flight
        if pending is not None and pending._is_written():
            self._finish(pending)

    def wait(self) -> None:
        """Block until the save in flight (if any) is complete, and finish it.

        Raises:
            CheckpointError: the background write failed; the message names the checkpoint.
        """
        if self._in_flight is not None:
            self._wait_for(self._in_flight)

    def end_stage(self, trainer: Trainer, stage: str, status: str) -> None:
        """At the end of fit / validate / ...: wait for the save in flight, stop the thread.

        After a clean stage a failed write fails the stage (``on_exception`` hooks, then raised
        from ``fit``). When the stage already failed, the write failure is logged and added to
        the error in flight as a note, so it is not lost either.
        """
        active = sys.exc_info()[1]  # the error that ends a failed stage, if any
        try:
            self.wait()
        except BaseException as err:
            if status == "finished":
                trainer._handle_exception(err, stage)
                raise
            if not isinstance(err, Exception):  # an interrupt while waiting: let it through
                raise
            _log.error("%s", err)
            if active is not None:
                active.add_note(f"Also, a background checkpoint save failed: {err}")
        finally:
            self._stop_thread()
            self._spare = []  # no host copy is kept once the stage is over
            self._sharded.release(is_clean=status == "finished")

    # ---- internals -------------------------------------------------------------------------
    def _submit(
        self, pending: PendingSave, path: Path, job: Callable[[], None]
    ) -> concurrent.futures.Future[None]:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=_THREAD_NAME
            )
        return self._executor.submit(pending._run, path, job)

    def _wait_for(self, pending: PendingSave) -> None:
        if not pending._is_written():
            start = time.perf_counter()
            concurrent.futures.wait(pending._futures)
            waited = time.perf_counter() - start
            self._waited += waited
            self.total_wait_s += waited
            _log.debug("waited %.3f s for the background save of %s", waited, pending.path)
        self._finish(pending)

    def _finish(self, pending: PendingSave) -> None:
        """On the training thread: raise the write's failure, or run what waited for it."""
        if self._in_flight is pending:
            self._in_flight = None
        if pending._is_finished:
            return
        pending._is_finished = True
        if pending._writer is not None:  # the host copy: its memory serves the next snapshot
            self._spare, pending._writer = pending._writer.release(), None
        error = pending._error
        if error is not None:
            raise CheckpointError(
                f"the background save of checkpoint {pending._failed_path} failed: {error}. "
                "Checkpoints written before it are intact; free space or fix the folder, then "
                "resume with fit(ckpt_path='last')."
            ) from error
        continuations, pending._continuations = pending._continuations, []
        for function in continuations:
            function()

    def _stop_thread(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _warn_synchronous(self, strategy: Strategy) -> None:
        name = type(strategy).__name__
        if name in self._warned:
            return
        self._warned.add(name)
        warnings.warn(
            f"AsyncCheckpointIO: {name} writes its own checkpoint files (through its engine), "
            "so its checkpoints are saved synchronously. Remove AsyncCheckpointIO from plugins "
            "to silence this, or use a strategy it saves in the background (single device, "
            "DDP, FSDP).",
            stacklevel=4,
        )


def _writes_with_common_writer(strategy: Strategy) -> bool:
    """Whether ``strategy`` saves with the base writer (process 0, one directory): single, DDP,
    and FSDP with FULL state dicts (``has_sharded_checkpoints`` False: gathered on process 0).

    Other strategies that override ``save_checkpoint`` write shards or engine files
    collectively, which a background thread on one process cannot do.
    """
    from trainer.strategies.strategy import Strategy

    if getattr(strategy, "has_sharded_checkpoints", None) is False:
        return True
    return type(strategy).save_checkpoint is Strategy.save_checkpoint


def find_checkpoint_io(plugins: Any) -> AsyncCheckpointIO | None:
    """The `AsyncCheckpointIO` among ``Trainer(plugins=...)``, or None (synchronous saves).

    ``resolve_plugins`` has already refused anything else and two of a kind.
    """
    items = plugins if isinstance(plugins, list | tuple) else [plugins]
    return next((item for item in items if isinstance(item, AsyncCheckpointIO)), None)
