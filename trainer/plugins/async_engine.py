"""Background saves of checkpoints whose engine writes its own files (DeepSpeed), for
`AsyncCheckpointIO`.

Owns the copy such a save is staged with (`copy_to_host`: a deep copy whose tensors are host
tensors, tensors that share storage still sharing it, so the engine writes the very file it would
have written from the originals) and the `EngineWriter` that finishes the save on the writer
thread. The strategy stages it on the training thread (``stage_async_save``: DeepSpeed runs its
own ``engine.save_checkpoint`` with a checkpoint engine that copies each state dict and defers
its write; `trainer.strategies.deepspeed_checkpoint.StagedCheckpoint`). Then, on the writer
thread, every process writes its files with DeepSpeed's own checkpoint engine into the staging
folder (fsynced), the processes agree that every one succeeded (on the checkpoint process group,
never training's), process 0 commits the checkpoint exactly as a synchronous save does (files
moved into an atomic directory, JSON state, manifest, rename), and tells the others whether it
did. So a checkpoint appears under its name only when complete, and every process learns of a
failure.

Not owned: the thread, the one save in flight and raising failures on the training thread
(``async_checkpoint.py``), the checkpoint process group (``async_sharded.py``'s `ShardedSaves`),
DeepSpeed's file layout (DeepSpeed's, inside ``deepspeed_checkpoint.py``'s folder).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.sharded_async import write_and_commit
from trainer.errors import CheckpointError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from trainer.strategies import Strategy
    from trainer.strategies.deepspeed_checkpoint import StagedCheckpoint

__all__ = ["EngineWriter", "copy_to_host", "saves_engine_files"]


def saves_engine_files(strategy: Strategy) -> bool:
    """Whether ``strategy`` stages its engine's own files for a background save
    (``stage_async_save``: DeepSpeed)."""
    return callable(getattr(strategy, "stage_async_save", None))


def copy_to_host(value: Any) -> Any:
    """A deep copy of ``value`` that later training cannot change, every tensor in host memory.

    Tensors reached through dicts, lists and tuples are copied storage by storage: views of one
    storage stay views of one copy (``torch.save`` writes each storage once, so the file is the
    one the originals give), a ``Parameter`` stays one, ``requires_grad`` is kept. Everything
    else is ``copy.deepcopy``'d (DeepSpeed's loss scalers, its config, shapes).
    """
    storages: dict[tuple[Any, ...], torch.UntypedStorage] = {}
    memo: dict[int, Any] = {}
    for tensor in _tensors(value):
        if id(tensor) not in memo:
            memo[id(tensor)] = _host_tensor(tensor, storages)
    return copy.deepcopy(value, memo)


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return found


def _host_tensor(
    tensor: torch.Tensor, storages: dict[tuple[Any, ...], torch.UntypedStorage]
) -> torch.Tensor:
    """``tensor``'s copy: the same view of a host copy of its storage (made once per storage)."""
    if tensor.device.type == "meta":
        return tensor  # no data to copy
    storage = tensor.untyped_storage()
    # Empty storages all sit at address 0: each gets its own copy, as each has its own storage.
    key = (tensor.device, storage.data_ptr() or id(tensor), storage.nbytes())
    host = storages.get(key)
    if host is None:
        host = torch.empty(storage.nbytes(), dtype=torch.uint8).untyped_storage()
        host.copy_(storage)  # blocking: the copy is complete when the save call returns
        storages[key] = host
    view = torch.empty(0, dtype=tensor.dtype).set_(
        host, tensor.storage_offset(), tensor.size(), tensor.stride()
    )
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(view, requires_grad=tensor.requires_grad)
    return view.requires_grad_(tensor.requires_grad)  # as torch.save keeps it, views included


class EngineWriter:
    """Finishes one `StagedCheckpoint` on the writer thread, destination after destination.

    A `trainer.plugins.async_checkpoint.Writer`: `prepare` (training thread, every process)
    adds a destination, the first being the staged one; the job it returns writes it.
    """

    def __init__(
        self, strategy: Strategy, staged: StagedCheckpoint, process_group: ProcessGroup
    ) -> None:
        self._strategy = strategy
        self._staged = staged
        self._group = process_group
        self._is_zero = strategy.is_global_zero
        self._world_size = strategy.world_size
        self._destinations: list[tuple[Path, Path]] = []  # (checkpoint, its staging folder)

    def prepare(self, path: Path) -> Callable[[], None]:
        """The job for ``path``; from the second on, every process agrees on its staging here.

        Raises:
            CheckpointError: on every process, when ``path`` holds something not a checkpoint.
        """
        from trainer.checkpoint.sharded import agree_on_staging

        staging = self._staged.staging
        if self._destinations:
            staging = agree_on_staging(self._strategy, Path(path), self._staged.subdir or "full")
        self._destinations.append((Path(path), staging))
        return functools.partial(self.write, len(self._destinations) - 1)

    def release(self) -> list[torch.Tensor]:
        """Nothing for the next whole-state snapshot: the copy is dropped with this writer."""
        return []

    def write(self, index: int) -> None:
        """On the writer thread: write destination ``index`` and commit it (every process).

        Raises:
            CheckpointError: on every process, when any process's files or process 0's commit
                failed, with each cause (the caller names the checkpoint).
        """
        final, staging = self._destinations[index]
        write_and_commit(
            self._group, self._world_size, self._is_zero,
            write=lambda: write_engine_files(self._staged, staging, is_first=index == 0),
            commit=lambda _records: self._commit(final, staging), staging=staging, what="files",
        )  # fmt: skip

    def _commit(self, final: Path, staging: Path) -> None:
        """On process 0, once every process wrote its files: the checkpoint, atomically."""
        from trainer.checkpoint.format import write_checkpoint
        from trainer.checkpoint.sharded import commit_staged

        staged = self._staged
        if staged.subdir is None:  # a weights-only checkpoint: written whole, as synchronously
            write_checkpoint(final, staged.rest, world_size=self._world_size)
            return
        commit_staged(final, staging, staged.subdir, staged.rest, world_size=self._world_size)


def write_engine_files(staged: StagedCheckpoint, folder: Path, *, is_first: bool) -> None:
    """This process's engine files into ``folder``, each written by the engine's own ``save``
    and fsynced, then the engine's ``commit``. A destination after the first also gets the
    files the engine wrote itself into the first (its recovery scripts)."""
    if staged.subdir is None or staged.save is None:
        return  # a weights-only checkpoint: process 0 writes it whole when it commits
    if not is_first:
        for name, data in staged.copied:
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            _fsync(target)
    for name, state in staged.files:
        target = folder / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            staged.save(state, str(target))
            _fsync(target)
        except (OSError, RuntimeError) as err:  # torch's zip writer reports a full disk so
            raise CheckpointError(f"DeepSpeed's file {name} could not be written: {err}") from err
    if staged.commit is not None:
        staged.commit()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
