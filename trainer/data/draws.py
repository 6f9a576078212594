"""What a prepared loader takes from torch's random generators: as much as torch's DataLoader.

torch's ``DataLoader`` draws one value (its workers' base seed) from its ``generator`` — torch's
global generator when it has none — each time it makes an iterator: at every pass, or only at
the first one with persistent workers. Under Accelerate that is the stream dropout and every
other random op of the step continue from, so a prepared loader takes the same values at the
same moments (`PassDraws`). A loader without a seed leaves the drawing to torch. A loader with
one reads through loaders whose ``generator`` is its own (the workers' seeds follow
``(seed, epoch)``), so it takes the value itself, at every pass: with persistent workers too,
so that a run's random stream does not depend on ``num_workers`` (torch takes one at the first
pass only there).

Also trainer's own: a pass that continues a pass cut short — a mid-epoch resume —
takes nothing, since its value was taken when that pass began (and the random states restored
with it were saved after it). It continues when it is the first pass of the loaded epoch after
``load_state_dict`` of a state saved while the pass was being read, or when the loader itself
(not a ``skip_first_batches`` copy, which is a new loader as in Accelerate) starts the epoch of
its unfinished pass with batches to skip, as the Trainer's resume does.

`random_samplers` finds the samplers a seed orders, for ``prepare`` and ``set_epoch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset, default_collate

from trainer.data.rebuild import stateful_sampler_types
from trainer.errors import CheckpointError, describe

__all__ = [
    "PassDraws",
    "drawing_elsewhere",
    "draws_nothing",
    "random_samplers",
    "set_generator_state",
    "take_torch_value",
]

# State keys (in DataLoaderShard.state_dict).
PASS_DRAWN = "pass_drawn"  # this epoch's pass has taken its value and has not run to its end
PASS_OPEN = "pass_open"  # ... and was being read when the state was taken
PASS_SPENT = "pass_spent"  # ... in its last batch: a loop iterating again starts the next epoch


def take_torch_value(generator: torch.Generator | None) -> None:
    """Draw what ``torch.utils.data``'s iterator draws when it is made (its ``_base_seed``)."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)


@contextmanager
def drawing_elsewhere(loader: DataLoader) -> Iterator[None]:
    """While inside, an iterator made from ``loader`` draws its value from a throwaway generator
    instead of torch's global one (a continued pass must not move the training's stream)."""
    if not isinstance(loader, DataLoader) or loader.generator is not None:
        yield  # the loader's own generator: a synchronized one is rewound, so it replays
        return
    loader.generator = torch.Generator()
    try:
        yield
    finally:
        loader.generator = None


class PassDraws:
    """When the passes of a loader (and its ``skip_first_batches`` copies) take torch's value.

    Args:
        loader: the wrapped DataLoader, before a seed replaces its ``generator``.
    """

    def __init__(self, loader: Any) -> None:
        generator = getattr(loader, "generator", None)
        self.generator: torch.Generator | None = (
            generator if isinstance(generator, torch.Generator) else None
        )
        self.is_torch_loader = isinstance(loader, DataLoader)  # other iterables draw nothing
        self.drawn_epoch: int | None = None  # its pass took the value and has not ended
        self.is_open = False  # a pass is being read now
        self.is_resuming_open = False  # loaded: the pass of `drawn_epoch` was being read

    def begin(self, epoch: int, *, is_resuming: bool) -> bool:
        """A pass of ``epoch`` starts; whether it takes a value (it continues no cut pass).

        Args:
            epoch: the pass's epoch.
            is_resuming: the loader itself starts with batches to skip (the Trainer's resume).
        """
        continues = self.drawn_epoch == epoch and (is_resuming or self.is_resuming_open)
        self.is_resuming_open = False  # only the first pass after a load may continue
        self.drawn_epoch, self.is_open = epoch, True
        return self.is_torch_loader and not continues

    def end(self, *, is_complete: bool) -> None:
        """The pass ends: run to its end (its value is spent) or cut short (kept for a resume)."""
        self.is_open = False
        if is_complete:
            self.drawn_epoch = None

    def state_dict(self, epoch: int) -> dict[str, bool]:
        """The entries of the loader's state at ``epoch``: none unless its pass is cut."""
        if self.drawn_epoch != epoch:
            return {}
        return {PASS_DRAWN: True, PASS_OPEN: True} if self.is_open else {PASS_DRAWN: True}

    def load_state_dict(self, state: dict[str, Any], epoch: int) -> None:
        """Take `state_dict`'s entries, the loader being at ``epoch``.

        Raises:
            CheckpointError: an entry is not a bool.
        """
        for key in (PASS_DRAWN, PASS_OPEN, PASS_SPENT):
            if not isinstance(state.get(key, False), bool):
                raise CheckpointError(
                    f"loader state: field {key!r} must be a bool; received "
                    f"{describe(state[key])}. Load a checkpoint saved from this loader's setup."
                )
        is_drawn = state.get(PASS_DRAWN, False)
        self.drawn_epoch = epoch if is_drawn else None
        self.is_resuming_open = is_drawn and state.get(PASS_OPEN, False)


def random_samplers(loader: DataLoader) -> list[RandomSampler]:
    """The RandomSamplers a loader draws from, also inside (sharded) batch samplers."""
    found, pending, seen = [], [loader.sampler, loader.batch_sampler], set()
    while pending:
        obj = pending.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (RandomSampler, *stateful_sampler_types())):
            found.append(obj)
        pending += [getattr(obj, "sampler", None), getattr(obj, "batch_sampler", None)]
    return found


# Datasets whose reads draw no random number (they index tensors): seeding their fetches would
# cost tens of microseconds a batch (seed three generators, save and restore the training's)
# and change nothing. A subclass may override __getitem__, so only these exact types qualify.
_DATASETS_THAT_DRAW_NOTHING: tuple[type, ...] = (TensorDataset,)


def draws_nothing(loader: DataLoader) -> bool:
    """Whether reading ``loader`` draws no random number: a tensor dataset, default collation."""
    return type(loader.dataset) in _DATASETS_THAT_DRAW_NOTHING and loader.collate_fn in (
        default_collate,
        None,
    )


def set_generator_state(generator: torch.Generator, state: Any, field: str = "generator") -> None:
    """Restore a saved generator state (loader state ``field``), refusing anything torch would
    not have written."""
    try:
        generator.set_state(state)
    except (RuntimeError, TypeError) as err:
        raise CheckpointError(
            f"loader state: field {field!r} is not a torch.Generator state (received "
            f"{describe(state)}). Load a checkpoint saved from this loader's setup."
        ) from err
