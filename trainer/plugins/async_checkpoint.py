"""Checkpoints copied off the device at the step boundary and written on a background thread.

This module owns the one writer thread, the one save in flight (`PendingSave`), and running on the
training thread what has to wait until a save is complete (a ModelCheckpoint's rotation and
``last`` swap). The copy of the state it writes is `trainer.plugins.async_snapshot`'s (every
tensor copied to host memory, pinned on CUDA; re-exported here).
It does not own the file format, hashing, fsync or the atomic rename: the background thread calls
the same `trainer.checkpoint.write_checkpoint` as a synchronous save, or, for a strategy whose
every rank writes its part (FSDP's SHARDED state dicts, Megatron, DeepSpeed), finishes the save
that `trainer.plugins.async_sharded` started (DCP's ``async_save``, or DeepSpeed's files staged
by ``engine.save_checkpoint``, `trainer.plugins.async_engine`). Nor does it decide when or what
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

    def __init__(
        self,
        path: Path,
        writer: Writer | None,
        *,
        submit: Callable[[Callable[[], None]], concurrent.futures.Future[None]],
        on_end: Callable[[PendingSave, float, list[torch.Tensor] | None], None],
    ) -> None:
        """Start writing ``path`` with ``writer`` (``AsyncCheckpointIO.save_checkpoint`` does).

        Args:
            path: the checkpoint directory.
            writer: writes each destination; None on a process that writes nothing (not
                process 0 under DDP).
            submit: runs a job on the writer thread.
            on_end: told once, on the training thread, when the save ends (written or failed):
                this save, the seconds waited for it, and the host memory the next snapshot
                may reuse (None: nothing to give back).
        """
        self.path = path
        self.paths = [path]
        self._submit = submit
        self._on_end = on_end
        self._writer = writer
        self._is_writer = writer is not None
        self._futures: list[concurrent.futures.Future[None]] = []
        self._continuations: list[Callable[[], None]] = []
        self._error: BaseException | None = None  # set by the writer thread
        self._failed_path: Path | None = None
        self._is_finished = writer is None  # written and its continuations run (or failed)
        if writer is not None:
            self._write_to(writer, path)

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
            self._write_to(self._writer, path)

    def wait(self) -> None:
        """Block until complete; then run what waited for it.

        Raises:
            CheckpointError: the background write failed (raised once, by the first wait).
        """
        if self._is_finished:
            return
        waited = 0.0
        if not self._is_written():
            start = time.perf_counter()
            concurrent.futures.wait(self._futures)
            waited = time.perf_counter() - start
            _log.debug("waited %.3f s for the background save of %s", waited, self.path)
        self._finish(waited)

    # ---- internals --------------------------------------------------------------------------
    def _write_to(self, writer: Writer, path: Path) -> None:
        """On the training thread: queue the job that writes ``path``."""
        job = writer.prepare(path)
        self._futures.append(self._submit(functools.partial(self._run, path, job)))

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

    def _finish(self, waited: float) -> None:
        """On the training thread: raise the write's failure, or run what waited for it."""
        self._is_finished = True
        writer, self._writer = self._writer, None
        # The host copy: its memory serves the next snapshot.
        self._on_end(self, waited, writer.release() if writer is not None else None)
        error = self._error
        if error is not None:
            raise CheckpointError(
                f"the background save of checkpoint {self._failed_path} failed: {error}. "
                "Checkpoints written before it are intact; free space or fix the folder, then "
                "resume with fit(ckpt_path='last')."
            ) from error
        continuations, self._continuations = self._continuations, []
        for function in continuations:
            function()


class AsyncCheckpointIO:
    """Write checkpoints in the background: ``Trainer(plugins=[AsyncCheckpointIO()])``.

    At the step boundary the checkpoint is copied to host memory (every tensor; pinned memory
    and an asynchronous copy on CUDA), so training can go on at once and cannot change what is
    written. One background thread then writes it with the synchronous path's writer (same
    files, sha256, fsync, atomic rename). At most one save is in flight: a new one first waits
    for the previous. Extra host memory: one copy of the checkpoint's tensors.

    Under FSDP's SHARDED state dicts every process copies its own shards and writes them with
    ``torch.distributed.checkpoint.async_save`` (Megatron too); process 0 commits the checkpoint
    (manifest, digests, rename) once every process wrote its part
    (`trainer.plugins.async_sharded`). Under DeepSpeed, ``engine.save_checkpoint`` runs at the
    step boundary with a checkpoint engine that copies each of its state dicts to host memory;
    DeepSpeed's own checkpoint engine writes the copies on the background thread, and process 0
    commits the same way (`trainer.plugins.async_engine`).

    A save runs in the background only while ``fit`` runs; elsewhere (after ``fit``, in
    ``on_exception``) it is synchronous. Strategies that write through an engine of their own
    that cannot be deferred (DeepSpeed with a ``checkpoint.writer`` in its config or NVMe
    optimizer offload) save synchronously, with a warning the first time. Under XLA the pending
    graph runs first (``xm.mark_step``, every process), then the copy as above.

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
            CheckpointError: a value cannot be stored (raised here, naming where it is), the
                folder cannot hold the checkpoint (under a sharded save, on every process), or
                the previous background save failed.
        """
        self.wait()  # at most one in flight
        is_sharded = saves_sharded(strategy)
        if not in_background or not (is_sharded or _writes_with_common_writer(strategy)):
            if in_background:
                self._warn_synchronous(strategy)
            strategy.save_checkpoint(path, checkpoint)
            return None
        self.last_wait_s, self._waited = self._waited, 0.0
        strategy.prepare_state_copy()  # every process, as the synchronous save (XLA's graph)
        if not is_sharded and not strategy.is_global_zero:  # as synchronously: process 0 writes
            return PendingSave(Path(path), None, submit=self._submit, on_end=self._ended)
        start = time.perf_counter()
        writer: Writer | None
        if is_sharded:  # every process copies and writes its part
            writer = self._sharded.start(strategy, path, checkpoint)
            if writer is None:  # the strategy's engine writes this checkpoint itself
                self._warn_synchronous(strategy)
                strategy.save_checkpoint(path, checkpoint)
                return None
        else:
            writer = _SnapshotWriter(
                snapshot_checkpoint(checkpoint, spare=self._spare), strategy.world_size
            )
            self._spare = []  # those not reused are freed
        self.last_snapshot_s = time.perf_counter() - start
        pending = PendingSave(Path(path), writer, submit=self._submit, on_end=self._ended)
        self._in_flight = pending
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
        if pending is not None and pending.has_ended:
            pending.wait()  # does not block: it has ended

    def wait(self) -> None:
        """Block until the save in flight (if any) is complete, and finish it.

        Raises:
            CheckpointError: the background write failed; the message names the checkpoint.
        """
        if self._in_flight is not None:
            self._in_flight.wait()

    def end_stage(self, status: str, *, fail_stage: Callable[[BaseException], None]) -> None:
        """At the end of fit / validate / ...: wait for the save in flight, stop the thread.

        After a clean stage a failed write fails the stage (``fail_stage``, then raised from
        ``fit``). When the stage already failed, the write failure is logged and added to the
        error in flight as a note, so it is not lost either.

        Args:
            status: how the stage ended: "finished", "failed" or "interrupted".
            fail_stage: after a clean stage, called with the write's failure before it is
                raised (the Trainer runs the ``on_exception`` hooks and tears down as failed).
        """
        active = sys.exc_info()[1]  # the error that ends a failed stage, if any
        try:
            self.wait()
        except BaseException as err:
            if status == "finished":
                fail_stage(err)
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

    def close(self) -> None:
        """Wait for the save in flight, then free what saves hold between stages: the writer
        thread, the host copy, and the process group and stager of sharded saves.

        ``Accelerator.end_training`` calls it (every process: sharded saves end their group
        together). A later save starts them again.

        Raises:
            CheckpointError: the save in flight failed (what it held is freed all the same).
        """
        self.end_stage("finished", fail_stage=lambda err: None)

    # ---- internals -------------------------------------------------------------------------
    def _submit(self, job: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Run ``job`` on the writer thread (started on first use)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=_THREAD_NAME
            )
        return self._executor.submit(job)

    def _ended(self, pending: PendingSave, waited: float, spare: list[torch.Tensor] | None) -> None:
        """A save ended (`PendingSave`'s ``on_end``): count the wait, take back its memory."""
        self._waited += waited
        self.total_wait_s += waited
        if self._in_flight is pending:
            self._in_flight = None
        if spare is not None:
            self._spare = spare

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
            "DDP, FSDP, XLA, Megatron, DeepSpeed with its default checkpoint engine).",
            stacklevel=4,
        )


def _writes_with_common_writer(strategy: Strategy) -> bool:
    """Whether ``strategy`` saves with the base writer (process 0, one directory): single, DDP,
    FSDP with FULL state dicts and XLA (``has_sharded_checkpoints`` False: the whole state on
    process 0).

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
