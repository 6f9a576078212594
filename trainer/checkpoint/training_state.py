"""The training state both checkpoint writers share, captured and put back in one place.

A Trainer checkpoint (`trainer.trainer.checkpoint_state`) and an Accelerator's ``save_state``
(`trainer.checkpoint.accelerator_state`) hold the same core: the first model's weights in the
strategy's layout, the optimizer and scheduler states, the precision plugin's state (a grad
scaler), each prepared loader's position (a StatefulDataLoader's on every process) and every
process's RNG states. `capture_training_state` builds that core, so both take the same
collectives in the same order; `load_states`, `loader_state_for_rank` and `rng_state_for_rank`
take it back. Each owner adds what only it has under its own keys (the Trainer: progress,
callbacks, loggers...; the Accelerator: further models, custom objects, the iteration).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.optimizer_state import check_optimizer_state
from trainer.errors import CheckpointError, CheckpointMismatchError
from trainer.runtime.seed import get_rng_states

if TYPE_CHECKING:
    from trainer.precision import Precision
    from trainer.strategies import Strategy

__all__ = [
    "TrainingObjects",
    "capture_training_state",
    "gather_loader_state",
    "load_model_state",
    "load_state_into",
    "load_states",
    "loader_state_for_rank",
    "rng_state_for_rank",
]

_PER_RANK = "loader_per_rank"


@dataclass(frozen=True)
class TrainingObjects:
    """What a checkpoint's training state is read from and loaded into.

    Attributes:
        model: the model whose weights go under ``"state_dict"`` (unwrapped), or None.
        optimizers: the prepared optimizers.
        schedulers: the learning-rate schedulers.
        dataloaders: the prepared loaders whose position is saved.
        precision: the precision plugin (its grad scaler's state).
    """

    model: torch.nn.Module | None
    optimizers: Sequence[Any]
    schedulers: Sequence[Any]
    dataloaders: Sequence[Any]
    precision: Precision


def capture_training_state(strategy: Strategy, objects: TrainingObjects) -> dict[str, Any]:
    """The shared core of a checkpoint, on every process (it holds collectives).

    Returns:
        ``state_dict`` (the model in the strategy's layout: DCP shards under FSDP's SHARDED
        state dicts), ``optimizer_states``, ``lr_schedulers``, ``precision``, ``dataloaders``
        (one state per loader, see `gather_loader_state`) and ``rng_states`` (one per process).
    """
    model = objects.model
    return {
        "state_dict": strategy.module_state_dict(model, full=False) if model is not None else {},
        "optimizer_states": [optimizer.state_dict() for optimizer in objects.optimizers],
        "lr_schedulers": [scheduler.state_dict() for scheduler in objects.schedulers],
        "precision": objects.precision.state_dict(),
        "dataloaders": [
            gather_loader_state(
                loader.state_dict(),
                all_gather_object=strategy.all_gather_object,
                world_size=strategy.world_size,
            )
            for loader in objects.dataloaders
        ],
        "rng_states": strategy.all_gather_object(get_rng_states()),
    }


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


def rng_state_for_rank(rng_states: Sequence[Any] | None, rank: int) -> Any | None:
    """This process's saved RNG states (the last saved process's past them); None: none saved."""
    if not rng_states:
        return None
    return rng_states[min(rank, len(rng_states) - 1)]


def load_model_state(
    strategy: Strategy,
    module: torch.nn.Module,
    state: dict[str, Any],
    source: str | Path,
    strict: bool = True,
) -> None:
    """Load a checkpoint's weights into ``module`` through the strategy (``strict=False``:
    missing and unexpected keys are allowed, as ``load_state_dict`` allows them).

    Raises:
        CheckpointError: the weights do not fit the module (missing, unexpected or
            differently shaped tensors), naming ``source`` and the module's class.
    """
    try:
        strategy.load_module_state_dict(module, state, strict=strict)
    except RuntimeError as err:
        raise CheckpointMismatchError(
            f"{source}: the checkpoint's weights do not fit {type(module).__name__}: {err}"
        ) from err


def load_states(
    kind: str, targets: Sequence[Any], states: Sequence[Any], source: str | Path, fix: str
) -> None:
    """``target.load_state_dict(state)`` for each pair, after checking that the counts agree.

    Args:
        kind: what the states are, for messages ("optimizer_states", "lr_schedulers").
        targets: the objects to load into, in the order they were saved.
        states: the saved states.
        source: where the states come from (a checkpoint path or the call), for messages.
        fix: what the user should do when the counts differ.

    Raises:
        CheckpointError: the counts differ, or a state does not fit its object (a torch
            optimizer's ValueError / KeyError ..., or `check_optimizer_state`'s checks),
            naming ``source`` and the object.
    """
    if len(states) != len(targets):
        raise CheckpointError(
            f"{source}: the checkpoint has {len(states)} {kind} but {len(targets)} are "
            f"prepared or registered now. {fix}"
        )
    for index, (target, state) in enumerate(zip(targets, states, strict=True)):
        if kind == "optimizer_states":
            check_optimizer_state(target, state, source, index)
        load_state_into(target, state, source, f"{kind} do")


def load_state_into(target: Any, state: Any, source: str | Path, what: str) -> None:
    """``target.load_state_dict(state)``, where a state that does not fit (a crafted or older
    checkpoint: a missing key, a value of the wrong type) is a CheckpointError naming
    ``source`` and ``what`` ("callbacks['EarlyStopping'] does"), not the object's own error."""
    try:
        target.load_state_dict(state)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        name = type(getattr(target, "optimizer", target)).__name__
        raise CheckpointError(
            f"{source}: the checkpoint's {what} not fit {name}: {type(err).__name__}: {err}"
        ) from err
