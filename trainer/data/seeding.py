"""Seeded fetching: what a dataset draws from torch, numpy and ``random`` is a function of its place.

A dataset that augments (``torch.randn``, ``np.random.rand``, ``random.random`` in
``__getitem__`` or ``__iter__``) draws from the *global* generators of whichever process fetches:
the main process (``num_workers=0``), where the loader reads one batch ahead and training draws
too, or a worker, whose generators were seeded once when it started (persistent workers: once
for the whole run). Neither is replayed by a resume. Here the generators are seeded from the
data's place instead:

- map-style: `PositionedBatchSampler` tags each index batch with a seed computed in the main
  process from ``(seed, epoch, batch index, rank)``; `SeededMapDataset.__getitems__` (torch's
  fetcher calls it with the whole batch) seeds torch's CPU generator, numpy's legacy global one
  and ``random`` from it, then reads the samples. The same code runs in the main process and in
  workers, so a batch's values do not depend on ``num_workers`` or on which worker reads it.
- iterable: `SeededIterableDataset.__iter__` seeds them from ``(seed, epoch, worker id)``, read
  from a shared-memory tensor so persistent workers see each new epoch. Replaying the epoch up to
  the resume point replays its draws. The rank is left out on purpose: with several processes
  every process reads the same stream and keeps its share (``trainer/data/sharding.py``).
- in the main process, `DataRng` puts the training's generator states back after each read, so
  fetching never moves the training's random streams (dropout draws the same whatever
  ``num_workers`` is), and gives an iterable dataset its own stream, unmixed with training draws.

This module owns the seeds and the wrappers; `DataLoaderShard` (``loader.py``) decides when to
use them. It does not seed CUDA generators, nor generators a dataset creates for itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from trainer.data.generators import (
    get_generator_states,
    seed_generators,
    set_generator_states,
)

__all__ = [
    "DataRng",
    "PositionedBatchSampler",
    "SeededIterableDataset",
    "SeededMapDataset",
    "batch_seed",
    "seed_generators",
    "seeded_dataset",
]

_MASK64 = (1 << 64) - 1
_T = TypeVar("_T")


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def batch_seed(*parts: int) -> int:
    """A well-mixed 64-bit seed from integers, e.g. ``(seed, epoch, batch index, rank)``.

    Examples:
        >>> batch_seed(7, 0, 3, 0) == batch_seed(7, 0, 3, 0) != batch_seed(7, 0, 4, 0)
        True
    """
    mixed = 0
    for part in parts:
        mixed = _splitmix64(mixed ^ (part & _MASK64))
    return mixed


class DataRng:
    """Keeps main-process fetches off the training's generator states.

    Map-style (``keeps_stream=False``): `SeededMapDataset` calls `hold` before it seeds the
    generators for a batch, and `run` puts the training's states back once the batch is read
    (collated too, so a random ``collate_fn`` is seeded as well). The sampler draws outside
    that window, from the training's states, as it always did.

    Iterable (``keeps_stream=True``): `run` swaps the data's own states in for the whole read and
    keeps them for the next one, so the stream's draws go on from batch to batch, unmixed with
    training draws.
    """

    def __init__(self, *, keeps_stream: bool) -> None:
        self.keeps_stream = keeps_stream
        self._outer: tuple[Any, ...] | None = None
        self._stream: tuple[Any, ...] | None = None

    def __getstate__(self) -> dict[str, Any]:  # what a worker gets: no states, it never swaps
        return {"keeps_stream": self.keeps_stream, "_outer": None, "_stream": None}

    def hold(self) -> None:
        """Remember the training's states (once per read), to put back after it."""
        if self._outer is None:
            self._outer = get_generator_states()

    def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """``function(*args)`` (one read); the training's states are as before it afterwards."""
        if self.keeps_stream:
            self.hold()
            if self._stream is not None:
                set_generator_states(self._stream)
        try:
            return function(*args)
        finally:
            if self.keeps_stream:
                self._stream = get_generator_states()
            if self._outer is not None:
                set_generator_states(self._outer)
                self._outer = None


class _SeededBatch(list):
    """An index batch that carries the seed its samples are fetched with."""

    def __init__(self, indices: Any, seed: int) -> None:
        super().__init__(indices)
        self.seed = seed

    def __reduce__(self) -> tuple[Any, ...]:  # to workers: a plain list and the seed
        return _SeededBatch, (list(self), self.seed)


class PositionedBatchSampler(Sampler[list[Any]]):
    """Index batches of ``batch_sampler``, each tagged with its seed; the first ``skip`` dropped.

    ``seed``, ``epoch`` and ``skip`` are set by the loader before each pass; a batch's seed is
    ``batch_seed(seed, epoch, position, rank)`` with ``position`` counted from the epoch's start,
    skipped batches included, so a resumed epoch tags its batches as the uninterrupted one did.
    """

    def __init__(self, batch_sampler: Any, *, rank: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.rank = rank
        self.seed = 0
        self.epoch = 0
        self.skip = 0

    def __iter__(self) -> Iterator[list[Any]]:
        seed, epoch, skip, rank = self.seed, self.epoch, self.skip, self.rank
        for position, batch in enumerate(self.batch_sampler):
            if position >= skip:
                yield _SeededBatch(batch, batch_seed(seed, epoch, position, rank))

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip, 0)


class _Wrapper:
    """Reads and writes of unknown attributes go to the user's dataset.

    ``get_worker_info().dataset`` is the wrapper inside a worker; a ``worker_init_fn`` that sets
    ``dataset.start`` (PyTorch's sharding example) must still reach the user's dataset.
    """

    _OWN = frozenset({"dataset", "_main_rng", "_stream", "_pending_states"})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in self._OWN:  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)


class SeededMapDataset(_Wrapper, Dataset):
    """A map-style dataset whose batch reads are seeded by the batch (see module docstring).

    Args:
        dataset: the user's map-style dataset.
        main_rng: in the main process, told before the generators are seeded (see `DataRng`).
    """

    def __init__(self, dataset: Dataset, main_rng: DataRng | None = None) -> None:
        self.dataset = dataset
        self._main_rng = main_rng

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[Any]) -> list[Any]:
        seed = getattr(indices, "seed", None)
        if seed is not None:
            if self._main_rng is not None and get_worker_info() is None:
                self._main_rng.hold()
            seed_generators(seed)
        read_many = getattr(self.dataset, "__getitems__", None)
        if read_many:
            return read_many(list(indices))
        return [self.dataset[index] for index in indices]


class SeededIterableDataset(_Wrapper, IterableDataset):
    """An iterable dataset whose every pass starts from generators seeded by its place.

    Args:
        dataset: the user's iterable dataset.
        stream: a 2-element int64 tensor in shared memory holding ``(seed, epoch)``; the loader
            writes it before each pass, and workers (persistent ones too) read it.
    """

    def __init__(self, dataset: IterableDataset, stream: torch.Tensor) -> None:
        self.dataset = dataset
        self._stream = stream
        self._pending_states: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self._pending_states is not None:  # restored mid-epoch by a StatefulDataLoader
            set_generator_states(self._pending_states)
            self._pending_states = None
        else:
            info = get_worker_info()
            seed, epoch = (int(v) for v in self._stream.tolist())
            seed_generators(batch_seed(seed, epoch, info.id if info is not None else 0))
        return iter(self.dataset)


class _StatefulSeededMapDataset(SeededMapDataset):
    """For torchdata's StatefulDataLoader: the user's dataset state goes through."""

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]


class _StatefulSeededIterableDataset(SeededIterableDataset):
    """For torchdata's StatefulDataLoader: the dataset's state plus the generators' at that point.

    The state is taken where the draws happen (in the worker, or inside `DataRng` in the main
    process), so a stream restored mid-epoch continues with the draws it would have made.
    """

    def state_dict(self) -> dict[str, Any]:
        torch_state, python_state, numpy_state = get_generator_states(portable=True)
        return {
            "dataset": self.dataset.state_dict(),  # type: ignore[attr-defined]
            "rng": {"torch": torch_state, "python": python_state, "numpy": numpy_state},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["dataset"])  # type: ignore[attr-defined]
        rng = state["rng"]
        self._pending_states = (rng["torch"], rng["python"], rng["numpy"])


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def seeded_dataset(
    dataset: Dataset, *, stream: torch.Tensor | None = None, main_rng: DataRng | None = None
) -> Dataset:
    """Wrap ``dataset`` for seeded fetching; ``stream`` is required for an iterable dataset,
    ``main_rng`` (map-style) keeps main-process reads off the training's generators.

    The wrapper has ``state_dict`` / ``load_state_dict`` exactly when the dataset has them, so
    torchdata's StatefulDataLoader treats it as it would treat the dataset.
    """
    stateful = _is_stateful(dataset)
    if isinstance(dataset, IterableDataset):
        if stream is None:
            raise TypeError("seeded_dataset: an iterable dataset needs its (seed, epoch) stream")
        kind = _StatefulSeededIterableDataset if stateful else SeededIterableDataset
        return kind(dataset, stream)
    return (_StatefulSeededMapDataset if stateful else SeededMapDataset)(dataset, main_rng)
