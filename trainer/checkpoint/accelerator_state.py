"""The Accelerator's ``save_state`` / ``load_state`` / ``save_model``, in the checkpoint format.

``save_state`` writes every prepared model, optimizer, scheduler, dataloader position, the
precision plugin's state, registered objects and the RNG states as one checkpoint directory.
A torchdata ``StatefulDataLoader`` stands at its own place on each process, so its state is
gathered from every process (`gather_loader_state`, also used by the Trainer's checkpoints) and
each process takes its own back (`loader_state_for_rank`).
With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the directories are
``<project_dir>/checkpoints/checkpoint_<N>`` and only ``total_limit`` are kept, the oldest removed
after the new one is complete.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.accelerate_folder import is_accelerate_folder, read_accelerate_folder
from trainer.checkpoint.atomic import discard_directory
from trainer.checkpoint.format import (
    MODEL_FILE,
    MODEL_INDEX,
    write_model_files,
)
from trainer.errors import CheckpointError, ConfigurationError
from trainer.runtime.seed import get_rng_states, set_rng_states

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator
    from trainer.plugins import AsyncCheckpointIO

__all__ = [
    "CheckpointObjects",
    "gather_loader_state",
    "load_accelerator_state",
    "loader_state_for_rank",
    "save_accelerator_state",
    "save_model_weights",
]

_AUTO_NAME = re.compile(r"^checkpoint_(\d+)$")
_PER_RANK = "loader_per_rank"


@dataclass(frozen=True)
class CheckpointObjects:
    """What an Accelerator's ``save_state`` writes and ``load_state`` restores, in the order
    they were prepared or registered (the Accelerator hands over its own lists).

    Attributes:
        models: the prepared models (as prepared: possibly engine-wrapped).
        optimizers: the prepared optimizers.
        schedulers: the prepared schedulers.
        dataloaders: the prepared dataloaders.
        custom_objects: the objects given to ``register_for_checkpointing``.
    """

    models: Sequence[torch.nn.Module]
    optimizers: Sequence[Any]
    schedulers: Sequence[Any]
    dataloaders: Sequence[Any]
    custom_objects: Sequence[Any]


def gather_loader_state(
    state: dict[str, Any], *, all_gather_object: Callable[[Any], list[Any]], world_size: int
) -> dict[str, Any]:
    """A prepared loader's ``state`` with every process's ``"loader"`` entry added.

    Call it on every process (it is a collective when there is a StatefulDataLoader position to
    gather). A plain loader's state (seed and epoch, the same everywhere) comes back as it is.

    Args:
        state: this process's ``DataLoaderShard.state_dict()``.
        all_gather_object: the strategy's collective, one object per rank back.
        world_size: the number of processes.
    """
    if world_size <= 1 or "loader" not in state:
        return state
    return {**state, _PER_RANK: all_gather_object(state["loader"])}


def loader_state_for_rank(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """This process's state out of `gather_loader_state`'s (rank 0's past the saved ranks)."""
    own = {key: value for key, value in state.items() if key != _PER_RANK}
    per_rank = state.get(_PER_RANK)
    if per_rank:
        own["loader"] = per_rank[min(rank, len(per_rank) - 1)]
    return own


def _auto_dir(accelerator: Accelerator) -> Path:
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:
        raise ConfigurationError(
            "automatic_checkpoint_naming needs a project directory: Accelerator(project_dir=...) or ProjectConfiguration(project_dir=...)."
        )
    return Path(project_dir) / "checkpoints"


def _numbered(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), entry)
        for entry in directory.iterdir()
        if (m := _AUTO_NAME.match(entry.name))
    ]
    return sorted(found)


def save_accelerator_state(
    accelerator: Accelerator,
    output_dir: str | os.PathLike[str] | None,
    objects: CheckpointObjects,
    *,
    checkpoint_io: AsyncCheckpointIO | None = None,
) -> Path:
    """Write the Accelerator's whole state (in the background with ``checkpoint_io``); return
    the directory.

    Args:
        accelerator: whose strategy, precision and project configuration are used.
        output_dir: the directory; None with automatic checkpoint naming.
        objects: the Accelerator's prepared and registered objects.
        checkpoint_io: writes in the background when given.
    """
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        output = _auto_dir(accelerator) / f"checkpoint_{config.iteration}"
    elif output_dir is None:
        raise ConfigurationError(
            "save_state(): give a directory, or use ProjectConfiguration(automatic_checkpoint_naming=True) with a project_dir."
        )
    else:
        output = Path(output_dir)
    strategy = accelerator.strategy
    if checkpoint_io is not None:  # at most one save in flight: the previous one ends first
        checkpoint_io.wait()
    models = [accelerator.unwrap_model(model) for model in objects.models]
    # The first model and the optimizers keep the strategy's layout (DCP shards under FSDP's
    # SHARDED state dicts, written by every rank); further models are gathered in full.
    checkpoint: dict[str, Any] = {
        "state_dict": strategy.module_state_dict(models[0], full=False) if models else {},
        "other_models": [strategy.module_state_dict(model, full=True) for model in models[1:]],
        "num_models": len(models),  # the first state dict may be held by an engine (DeepSpeed)
        "optimizer_states": [optimizer.state_dict() for optimizer in objects.optimizers],
        "lr_schedulers": [scheduler.state_dict() for scheduler in objects.schedulers],
        "dataloaders": [  # a StatefulDataLoader's position on every process (a collective)
            gather_loader_state(
                loader.state_dict(),
                all_gather_object=strategy.all_gather_object,
                world_size=strategy.world_size,
            )
            for loader in objects.dataloaders
        ],
        "precision": accelerator.precision.state_dict(),
        "custom_objects": [obj.state_dict() for obj in objects.custom_objects],
        "rng_states": strategy.all_gather_object(get_rng_states()),  # one per process
        "iteration": config.iteration,
        "global_step": config.iteration,
    }
    pending = None  # every process calls it; the strategy (or the background writer) writes
    if checkpoint_io is None:
        strategy.save_checkpoint(output, checkpoint)
    else:
        pending = checkpoint_io.save_checkpoint(checkpoint, output, strategy=strategy)
    if config.automatic_checkpoint_naming:
        config.iteration += 1
        if config.total_limit is not None and accelerator.is_main_process:
            limit = config.total_limit
            if pending is None:
                _prune(output.parent, limit)
            else:  # only once the new one is complete
                pending.then(lambda: _prune(output.parent, limit))
    return output


def _prune(directory: Path, total_limit: int) -> None:
    """Delete the oldest ``checkpoint_<N>`` beyond ``total_limit``."""
    existing = _numbered(directory)
    for _, old in existing[: max(0, len(existing) - total_limit)]:
        discard_directory(old)  # renamed aside first: a kill never leaves half of one


def load_accelerator_state(
    accelerator: Accelerator,
    input_dir: str | os.PathLike[str] | None,
    objects: CheckpointObjects,
) -> Path:
    """Restore what `save_accelerator_state` wrote (newest automatic one when None).

    Args:
        accelerator: whose strategy, precision and project configuration are used.
        input_dir: the directory; None: the newest automatically named one.
        objects: the Accelerator's prepared and registered objects, loaded in place.
    """
    config = accelerator.project_configuration
    if input_dir is None:
        if not config.automatic_checkpoint_naming:
            raise ConfigurationError(
                "load_state(): give a directory, or use automatic_checkpoint_naming to load the newest."
            )
        existing = _numbered(_auto_dir(accelerator))
        if not existing:
            raise CheckpointError(
                f"load_state(): no checkpoint_N directory in {_auto_dir(accelerator)}."
            )
        source = existing[-1][1]
    else:
        source = Path(input_dir)
    if is_accelerate_folder(source):  # written by Hugging Face Accelerate's save_state
        checkpoint = read_accelerate_folder(source, accelerator.process_index)
    else:
        first = accelerator.unwrap_model(objects.models[0]) if objects.models else None
        checkpoint = accelerator.strategy.load_checkpoint(source, first)
    states = [checkpoint["state_dict"], *checkpoint.get("other_models", [])]
    saved_models = checkpoint.get("num_models", len(states) if states[0] else 0)
    _check_counts("models", saved_models, len(objects.models), source)
    for model, state in zip(objects.models, states, strict=False):
        accelerator.strategy.load_module_state_dict(accelerator.unwrap_model(model), state)
    for kind, kind_objects in (
        ("optimizer_states", objects.optimizers),
        ("lr_schedulers", objects.schedulers),
        ("custom_objects", objects.custom_objects),
    ):
        saved = checkpoint.get(kind, [])
        _check_counts(kind, len(saved), len(kind_objects), source)
        for obj, state in zip(kind_objects, saved, strict=True):
            obj.load_state_dict(state)
    for loader, state in zip(objects.dataloaders, checkpoint.get("dataloaders", []), strict=False):
        loader.load_state_dict(loader_state_for_rank(state, accelerator.process_index))
    accelerator.precision.load_state_dict(checkpoint.get("precision") or {})
    rng_states = checkpoint.get("rng_states") or []
    if rng_states:
        set_rng_states(rng_states[min(accelerator.process_index, len(rng_states) - 1)])
    if config.automatic_checkpoint_naming and input_dir is None:
        config.iteration = int(checkpoint.get("iteration", 0)) + 1
    return source


def _check_counts(kind: str, saved: int, prepared: int, source: Path) -> None:
    if saved != prepared:
        raise CheckpointError(
            f"load_state({source}): the checkpoint has {saved} {kind} but {prepared} are prepared/registered now. Prepare the same objects in the same order before loading."
        )


def save_model_weights(
    state_dict: dict[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str,
    safe_serialization: bool,
) -> None:
    """Write model weights into ``save_directory`` (safetensors, sharded past ``max_shard_size``).

    Stale weight files of an earlier save in the same directory are removed after the new ones
    are written; other files (a config.json, say) are left alone.
    """
    directory = Path(save_directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"save_model: {directory} is a file; give a directory.")
    directory.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in directory.iterdir() if p.name.startswith(("model", "pytorch_model"))}
    if safe_serialization:
        written = set(write_model_files(directory, state_dict, max_shard_size))
    else:
        torch.save(
            {k: v.contiguous() for k, v in state_dict.items()}, directory / "pytorch_model.bin"
        )
        written = {"pytorch_model.bin"}
    for stale in before - written:
        (directory / stale).unlink(missing_ok=True)
    if MODEL_FILE in written:
        (directory / MODEL_INDEX).unlink(missing_ok=True)
