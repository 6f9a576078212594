"""Background saves of sharded checkpoints for `AsyncCheckpointIO`: every process writes its part
(FSDP's and Megatron's DCP shards; DeepSpeed's own files, through ``async_engine.py``).

Owns what a stage of background sharded saves holds: the process group their collectives run on
(gloo, created by every process at the first sharded save of a stage; training's own group is
never used from the writer thread), DCP's stager that copies each process's shards to host
memory (pinned on CUDA; its buffers are reused from save to save and released when the stage
ends — from torch 2.13 on, see `stager_is_reusable`), and the `Writer` a `trainer.plugins.PendingSave` uses to finish a sharded save. The save
itself (``async_save`` into a staging folder, then process 0's commit) is
`trainer.checkpoint.sharded_async`'s, and for an engine that writes its own files (DeepSpeed),
``async_engine.py``'s; the thread, the one save in flight and raising failures on the training
thread are ``async_checkpoint.py``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.plugins.async_engine import EngineWriter, copy_to_host, saves_engine_files

if TYPE_CHECKING:
    import os
    from pathlib import Path

    import torch
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.staging import DefaultStager

    from trainer.checkpoint.sharded_async import AsyncShardedSave
    from trainer.strategies import Strategy

__all__ = ["ShardedSaves", "ShardedWriter", "saves_sharded", "stager_is_reusable"]


def saves_sharded(strategy: Strategy) -> bool:
    """Whether every process of ``strategy`` writes its part, and can do that in the background:
    DCP shards started with ``start_async_save`` (FSDP / ModelParallel with SHARDED state dicts,
    Megatron), or an engine's own files staged with ``stage_async_save`` (DeepSpeed)."""
    is_dcp = bool(getattr(strategy, "has_sharded_checkpoints", False)) and callable(
        getattr(strategy, "start_async_save", None)
    )
    return is_dcp or saves_engine_files(strategy)


class ShardedWriter:
    """Finishes one `AsyncShardedSave` on the writer thread, destination after destination."""

    def __init__(self, save: AsyncShardedSave) -> None:
        self._save = save
        self._count = 0  # destinations prepared so far

    def prepare(self, path: Path) -> Callable[[], None]:
        """The job for ``path``; from the second on, every process agrees on its staging here."""
        index = 0 if self._count == 0 else self._save.add_destination(path)
        self._count += 1
        return functools.partial(self._save.write, index)

    def release(self) -> list[torch.Tensor]:
        """Nothing for the next whole-state snapshot: the stager keeps its own buffers."""
        return []


class ShardedSaves:
    """The process group and stager of the sharded saves of one stage (fit)."""

    def __init__(self) -> None:
        self._group: ProcessGroup | None = None
        self._stager: DefaultStager | None = None

    def start(
        self, strategy: Strategy, path: str | os.PathLike[str], checkpoint: dict[str, Any]
    ) -> ShardedWriter | EngineWriter | None:
        """Copy this process's part and start writing it (every process calls it).

        Returns:
            The writer; None when the strategy writes this checkpoint at once (DeepSpeed with
            a checkpoint engine of its own choosing): save it synchronously.

        Raises:
            CheckpointError: on every process, when ``path`` is not a checkpoint or a value
                cannot be stored.
        """
        if self._group is None:
            import torch.distributed as dist

            # Collective: every process reaches its first sharded save of the stage together.
            self._group = dist.new_group(backend="gloo")
        if saves_engine_files(strategy):
            stage: Any = strategy.stage_async_save  # type: ignore[attr-defined] # checked above
            staged = stage(path, checkpoint, stage=copy_to_host)
            return None if staged is None else EngineWriter(strategy, staged, self._group)
        if self._stager is None:
            self._stager = _make_stager(strategy)
        start: Any = strategy.start_async_save  # type: ignore[attr-defined] # saves_sharded said
        writer = ShardedWriter(
            start(path, checkpoint, process_group=self._group, stager=self._stager)
        )
        if not stager_is_reusable():
            self._stager.close()  # the copy is made: a fresh stager for the next save
            self._stager = None
        return writer

    def release(self, *, is_clean: bool) -> None:
        """At the end of a stage, once no save is in flight: free the copy, end the group.

        After a clean stage every process meets the others first, so none returns from ``fit``
        before process 0 has run what waited for the last save (the ``last`` swap, rotation),
        as after a synchronous save. After a failed stage the group is left to the process's
        exit: another process may not get here, or may still be reading its last message.
        """
        stager, self._stager = self._stager, None
        if stager is not None:
            stager.close()
        group, self._group = self._group, None
        if group is not None and is_clean:
            import torch.distributed as dist

            dist.barrier(group=group)
            dist.destroy_process_group(group)


def stager_is_reusable(version: str | None = None) -> bool:
    """Whether DCP's ``DefaultStager`` can stage more than once (torch ``version``, this one's).

    torch 2.11 (and 2.12) close it at the end of every staging, and the next one fails with
    ``KeyError: <class 'type'>`` (pytorch/pytorch#183413, fixed by #183424; seen on an H200
    with torch 2.11). There, each save gets a fresh stager (pinned buffers are not reused).
    """
    import torch

    return torch.torch_version.TorchVersion(version or torch.__version__) >= "2.13"


def _make_stager(strategy: Strategy) -> DefaultStager:
    """DCP's stager: a blocking copy to host memory; pinned, with one device sync, on CUDA."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    is_cuda = strategy.root_device.type == "cuda"
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=is_cuda,
            use_shared_memory=False,
            use_async_staging=False,  # copied before training goes on: the step's own weights
            use_non_blocking_copy=is_cuda,
        )
    )
