"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP) shards inside the atomic directory.

Owns the save and load shared by the strategies whose state is split over ranks (FSDP,
Megatron). On save, every rank writes its shards into one staging folder beside the checkpoint;
rank 0 then moves that folder to ``<name>/dcp`` inside the atomic directory and writes the JSON
state and the manifest next to it. On load, every rank verifies and reads the JSON state, then
DCP fills the state dicts the strategy built for this rank.

Not owned: how a strategy shards its tensors or builds its state dicts (the strategy), the
directory format and atomic writes (``format.py``, ``atomic.py``). ``torch.distributed.checkpoint``
is imported on first use only, so ``import trainer`` does not load it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.checkpoint.atomic import atomic_directory, refusal_to_replace
from trainer.checkpoint.format import read_checkpoint, write_checkpoint_files
from trainer.errors import CheckpointError

__all__ = [
    "DCP_DIR",
    "ShardedStrategy",
    "has_sharded_state",
    "load_sharded_checkpoint",
    "save_sharded_checkpoint",
    "save_staged_checkpoint",
]

DCP_DIR = "dcp"


class ShardedStrategy(Protocol):
    """What the helpers use of a strategy: rank facts, two collectives, its state dicts."""

    @property
    def world_size(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...

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

    rest = dict(checkpoint)
    tensors = {"model": rest.pop("state_dict"), "optimizers": rest.pop("optimizer_states", [])}
    save_staged_checkpoint(
        strategy,
        path,
        DCP_DIR,
        lambda staging: dcp.save(tensors, checkpoint_id=str(staging)),
        rest,
    )


def save_staged_checkpoint(
    strategy: ShardedStrategy,
    path: str | os.PathLike[str],
    subdir: str,
    write_shards: Callable[[Path], Any],
    rest: dict[str, Any],
) -> None:
    """Every rank writes its shards to one staging folder; rank 0 commits it as ``path/subdir``.

    The staging folder is a hidden sibling of ``path`` (``.<name>.tmp-<subdir>-<token>``, so a
    crash leaves nothing that looks like a checkpoint). Rank 0 then builds the checkpoint in an
    atomic directory: the staging folder moved in as ``subdir``, ``rest`` written as JSON and
    tensor files, and the manifest over all of it. Every rank must call it.

    Args:
        strategy: gives the collectives and ranks (broadcast, barrier, is_global_zero).
        path: the checkpoint directory to create or replace.
        subdir: the name of the shards' folder inside the checkpoint.
        write_shards: called on every rank with the staging folder; writes that rank's shards.
        rest: what rank 0 writes next to the shards (``write_checkpoint_files``).

    Raises:
        CheckpointError: on every rank, when ``path`` holds something that is not a checkpoint;
            on rank 0, when it could not create, write or rename the directory.
    """
    final = Path(path)
    # One collective tells every rank the staging name and whether rank 0 may write at path,
    # so a refusal is raised on all ranks instead of leaving the others at the barrier.
    token, refusal = strategy.broadcast(
        (uuid.uuid4().hex[:12], refusal_to_replace(final)) if strategy.is_global_zero else None
    )
    if refusal is not None:
        raise CheckpointError(refusal)
    staging = final.parent / f".{final.name}.tmp-{subdir}-{token}"
    write_shards(staging)
    strategy.barrier()
    if strategy.is_global_zero:
        try:
            with atomic_directory(final) as directory:
                os.rename(staging, directory / subdir)
                write_checkpoint_files(directory, rest, world_size=strategy.world_size)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    strategy.barrier()


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
    checkpoint = read_checkpoint(directory)
    if module is None:
        raise CheckpointError(
            f"{directory}: a sharded checkpoint is loaded into a prepared model; prepare it first."
        )
    target = {
        "model": strategy.module_state_dict(module, full=False),
        "optimizers": [strategy.optimizer_state_dict(opt) for opt in optimizers],
    }
    dcp.load(target, checkpoint_id=str(directory / DCP_DIR))
    checkpoint["state_dict"] = target["model"]
    checkpoint["optimizer_states"] = target["optimizers"]
    return checkpoint
