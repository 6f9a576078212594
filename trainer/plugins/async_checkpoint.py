"""Checkpoints copied off the device at the step boundary and written on a background thread.

This module owns the snapshot (every tensor of the checkpoint copied to host memory, pinned on
CUDA), the one writer thread, the one save in flight (`PendingSave`), and running on the training
thread what has to wait until a save is complete (a ModelCheckpoint's rotation and ``last`` swap).
It does not own the file format, hashing, fsync or the atomic rename: the background thread calls
the same `trainer.checkpoint.write_checkpoint` as a synchronous save. Nor does it decide when or
what to save (``ModelCheckpoint``) or where the loop checks on the save (``trainer/trainer/trainer.py``).

The guarantees of a synchronous save hold (DESIGN §6, docs/checkpointing.md "Asynchronous saves"):
a checkpoint appears under its name only when complete; it holds the state of its own step; at
most one save is in flight (the next one waits, and the time it waited is recorded); a failure is
raised on the training thread, naming the checkpoint; ``fit`` returns only once the last save is
complete.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.codec import encode
from trainer.checkpoint.format import write_checkpoint
from trainer.errors import CheckpointError

if TYPE_CHECKING:
    import os

    from trainer.strategies import Strategy
    from trainer.trainer.trainer import Trainer

__all__ = [
    "AsyncCheckpointIO",
    "PendingSave",
    "Snapshot",
    "find_checkpoint_io",
    "snapshot_checkpoint",
]

_log = logging.getLogger(__name__)
_THREAD_NAME = "trainer-async-checkpoint"


@dataclasses.dataclass
class Snapshot:
    """A checkpoint copied to host memory, as the writer thread writes it.

    Attributes:
        checkpoint: the copy (same structure; every tensor a host tensor of its own).
        events: CUDA events recorded after the device-to-host copies (none on CPU); the writer
            synchronizes on them before reading.
        buffers: the host tensors allocated for it, reused by the next snapshot once written.
    """

    checkpoint: dict[str, Any]
    events: list[Any]
    buffers: list[torch.Tensor]


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
        self, io: AsyncCheckpointIO, path: Path, snapshot: Snapshot | None, world_size: int = 1
    ) -> None:
        self.path = path
        self.paths = [path]
        self._io = io
        self._snapshot = snapshot  # None on a process that writes nothing (not process 0)
        self._is_writer = snapshot is not None
        self._world_size = world_size
        self._futures: list[concurrent.futures.Future[None]] = []
        self._continuations: list[Callable[[], None]] = []
        self._error: BaseException | None = None  # set by the writer thread
        self._failed_path: Path | None = None
        self._is_finished = snapshot is None  # written and its continuations run (or failed)

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
            CheckpointError: the save is already complete (its copy of the state is released).
        """
        path = Path(path)
        if self._is_writer and self._is_finished:
            raise CheckpointError(
                f"PendingSave.also_write({str(path)!r}): the save of {self.path} is already "
                "complete and its copy of the state released. Call also_write right after "
                "save_checkpoint, before the next step boundary."
            )
        self.paths.append(path)
        if self._snapshot is not None:
            self._futures.append(self._io._submit(self, path))

    def wait(self) -> None:
        """Block until complete; then run what waited for it.

        Raises:
            CheckpointError: the background write failed (raised once, by the first wait).
        """
        if not self._is_finished:
            self._io._wait_for(self)

    # ---- the writer thread ----------------------------------------------------------------
    def _write(self, path: Path) -> None:
        """On the writer thread: wait for the device copies, then write atomically."""
        snapshot = self._snapshot
        if self._error is not None or snapshot is None:  # an earlier destination failed
            return
        try:
            for event in snapshot.events:
                event.synchronize()
            write_checkpoint(path, snapshot.checkpoint, world_size=self._world_size)
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

    A save runs in the background only while ``fit`` runs; elsewhere (after ``fit``, in
    ``on_exception``) it is synchronous. Strategies that write their own files (FSDP / DCP,
    DeepSpeed, Megatron, XLA) save synchronously, with a warning the first time.

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
        if not in_background or not _writes_with_common_writer(strategy):
            if in_background:
                self._warn_synchronous(strategy)
            strategy.save_checkpoint(path, checkpoint)
            return None
        self.last_wait_s, self._waited = self._waited, 0.0
        if not strategy.is_global_zero:  # as the synchronous path: only process 0 writes
            return PendingSave(self, Path(path), None)
        start = time.perf_counter()
        snapshot = snapshot_checkpoint(checkpoint, spare=self._spare)
        self._spare = []  # those not reused are freed
        self.last_snapshot_s = time.perf_counter() - start
        pending = PendingSave(self, Path(path), snapshot, strategy.world_size)
        self._in_flight = pending
        pending._futures.append(self._submit(pending, pending.path))
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

    # ---- internals -------------------------------------------------------------------------
    def _submit(self, pending: PendingSave, path: Path) -> concurrent.futures.Future[None]:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=_THREAD_NAME
            )
        return self._executor.submit(pending._write, path)

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
        if pending._snapshot is not None:  # the host copy: its memory serves the next snapshot
            self._spare, pending._snapshot = pending._snapshot.buffers, None
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
            f"AsyncCheckpointIO: {name} writes its own checkpoint files (sharded or through its "
            "engine), so its checkpoints are saved synchronously. Remove AsyncCheckpointIO from "
            "plugins to silence this, or use a strategy whose state is written whole by process "
            "0 (single device, DDP).",
            stacklevel=4,
        )


def _writes_with_common_writer(strategy: Strategy) -> bool:
    """Whether ``strategy`` saves with the base writer (process 0, one directory): DDP, single.

    Strategies that override ``save_checkpoint`` write shards or engine files collectively,
    which a background thread on one process cannot do.
    """
    from trainer.strategies.strategy import Strategy

    return type(strategy).save_checkpoint is Strategy.save_checkpoint


def snapshot_checkpoint(
    checkpoint: dict[str, Any], *, spare: list[torch.Tensor] | None = None
) -> Snapshot:
    """A copy of ``checkpoint`` that later training cannot change.

    Dicts, lists and tuples are rebuilt; every tensor is copied to host memory (one copy per
    distinct tensor, so tied weights stay tied); numpy values are copied; numbers, strings and
    bytes are immutable. CUDA tensors go to pinned memory with asynchronous copies, awaited by
    the writer through the returned events. Host tensors of the same shape and dtype in
    ``spare`` (an earlier snapshot's, already written) are filled instead of allocating: fresh
    memory costs page faults, several times the copy itself.

    Raises:
        CheckpointError: a value cannot be stored in a checkpoint (the message gives its path).
    """
    pool: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for buffer in spare or []:
        pool.setdefault((tuple(buffer.shape), buffer.dtype), []).append(buffer)
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    devices: set[torch.device] = set()

    def copied(value: Any, path: str) -> Any:
        if value is None or isinstance(value, bool | int | float | str | bytes):
            return value
        if isinstance(value, torch.Tensor):
            return _copy_tensor(value, copies, pool, devices)
        if isinstance(value, dict):
            return {key: copied(item, f"{path}.{key}") for key, item in value.items()}
        if isinstance(value, list):
            return [copied(item, f"{path}.{i}") for i, item in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(copied(item, f"{path}.{i}") for i, item in enumerate(value))
        if type(value).__module__ == "numpy":
            return copy.deepcopy(value)
        encode(value, {}, path)  # raises the format's own error for a value it cannot store
        return value

    result = {key: copied(value, str(key)) for key, value in checkpoint.items()}
    events = []
    for device in devices:  # after every copy was queued on the device's current stream
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return Snapshot(result, events, list(copies.values()))


def _copy_tensor(
    tensor: torch.Tensor,
    copies: dict[tuple[Any, ...], torch.Tensor],
    pool: dict[tuple[Any, ...], list[torch.Tensor]],
    devices: set[torch.device],
) -> torch.Tensor:
    """A host copy of ``tensor``; the same copy for another entry that is the same view."""
    tensor = tensor.detach()
    if tensor.device.type == "meta":
        return tensor  # no data: the writer reports it as it would synchronously
    view = (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )
    if view in copies and tensor.numel() > 0:
        return copies[view]
    is_cuda = tensor.device.type == "cuda"
    # Any host buffer will do: pinned or not, the copy is correct (pinned ones are faster).
    reusable = pool.get((tuple(tensor.shape), tensor.dtype))
    host = (
        reusable.pop()
        if reusable
        else torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=is_cuda)
    )
    host.copy_(tensor, non_blocking=is_cuda)
    if is_cuda:
        devices.add(tensor.device)
    copies[view] = host
    return host


def find_checkpoint_io(plugins: Any) -> AsyncCheckpointIO | None:
    """The `AsyncCheckpointIO` among ``Trainer(plugins=...)``, or None (synchronous saves).

    ``resolve_plugins`` has already refused anything else and two of a kind.
    """
    items = plugins if isinstance(plugins, list | tuple) else [plugins]
    return next((item for item in items if isinstance(item, AsyncCheckpointIO)), None)
