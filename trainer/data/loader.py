"""Prepared dataloaders: device placement, end-of-data lookahead, batch skipping and limits.

`DataLoaderShard` wraps a user's DataLoader for one process. It looks one batch ahead so
that the Accelerator knows, while the last batch is being used, that it is the last (gradient
accumulation syncs there; ``gather_for_metrics`` trims there). With a ``seed`` it reads through a
copy whose fetches are seeded by their place (``trainer/data/seeding.py``), so a resumed epoch
sees the same augmented values; a torchdata ``StatefulDataLoader`` keeps its own position in
``state_dict()``. Without a seed, a shuffling sampler that has its own generator keeps it (as in
Accelerate): each pass starts by giving every process the main process's generator state (the
``rng_types``), and ``state_dict()`` holds that state, so a reloaded loader shuffles alike.
Each pass takes from torch's generator what torch's DataLoader takes (``trainer/data/draws.py``).
Sharding across processes is decided by the strategy's ``distributed_sampler_kwargs`` and lives
in ``trainer/data/sharding.py``; ``trainer/data/prepare.py`` puts the pieces together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    Sampler,
)

from trainer.data.draws import (
    PASS_OPEN,
    PASS_SPENT,
    PassDraws,
    drawing_elsewhere,
    draws_nothing,
    random_samplers,
    set_generator_state,
    take_torch_value,
)
from trainer.data.fetch import iterate, makes_iterator
from trainer.data.generators import forget_generator_states
from trainer.data.rebuild import (
    index_batches_of,
    is_stateful_loader,
    rebuild_loader,
    with_index_batches,
)
from trainer.data.seeding import DataRng, PositionedBatchSampler, batch_seed, seeded_dataset
from trainer.data.transfer import send_to_device
from trainer.errors import CheckpointError, ConfigurationError
from trainer.runtime.seed import synchronize_rng_states

__all__ = [
    "DataLoaderShard",
    "SkipBatchSampler",
    "send_to_device",
    "skip_first_batches",
    "stop_workers",
]


def stop_workers(iterator: Any) -> None:
    """Stop the worker processes of a torch / torchdata DataLoader iterator (no-op without
    workers), and wait for the threads that fed their queues to end.

    The next pass then forks its workers while no Python thread is starting or ending: CPython
    3.11.7 (python/cpython#112275, fixed in later releases) can leave a child forked at that moment
    deadlocked before it runs, and the loader waits for it for ever (seen in this suite: a
    2-process resume test hung with a worker stuck in ``PyOS_AfterFork_Child``).
    """
    queues = getattr(iterator, "_index_queues", None)
    if not queues:
        return
    iterator._shutdown_workers()  # noqa: SLF001 - torch's iterator; it may run more than once
    for queue in queues:
        feeder = getattr(queue, "_thread", None)  # multiprocessing.Queue's feeder thread
        if feeder is not None:
            feeder.join(timeout=_FEEDER_JOIN_S)


_FEEDER_JOIN_S = 5.0  # a closed queue's feeder thread ends at once; this only bounds a stuck one


class SkipBatchSampler(BatchSampler):
    """Yields the batches of ``batch_sampler`` after the first ``skip_batches``."""

    def __init__(self, batch_sampler: Sampler[list[int]], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[list[int]]:
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)  # type: ignore[arg-type]


class DataLoaderShard(DataLoader):
    """A DataLoader prepared for one process.

    A ``DataLoader`` to ``isinstance`` (as Accelerate's is); its settings (``dataset``,
    ``batch_size``, ``sampler``, ...) are those of the loader it wraps.

    Args:
        dataloader: the user's DataLoader (already sharded for this process).
        device: where batches go, or None to leave them where the loader puts them.
        gradient_state: told of each batch (``begin_batch(shard, is_last)``) and of the end.
        transform: applied to each batch after the move (the precision plugin's input cast).
        skip_batches: batches to drop at the start of the next iteration (mid-epoch resume).
        process_index: this process's data-parallel rank; part of each batch's fetch seed.
    """

    def __init__(
        self,
        dataloader: DataLoader,
        *,
        device: torch.device | None = None,
        gradient_state: Any | None = None,
        transform: Callable[[Any], Any] | None = None,
        skip_batches: int = 0,
        process_index: int = 0,
    ) -> None:
        self.base_dataloader = dataloader
        self.device = device
        self.gradient_state = gradient_state
        self.transform = transform
        self.skip_batches = skip_batches
        self.limit: int | None = None  # stop after this many batches (Trainer's limit_*_batches)
        self.end_of_dataloader = False
        self.batches_yielded = 0
        self.remainder = -1  # samples in the last batch that are real (gather_for_metrics)
        self.total_batch_size: int | None = dataloader.batch_size  # every process's; by prepare
        self.seed: int | None = None  # set: shuffle order and every fetch's draws follow it
        self.process_index = process_index
        self._epoch = 0
        self._fetch_loader: DataLoader | None = None  # the seeded copy; kept: persistent workers
        self._stream: torch.Tensor | None = None  # (seed, epoch) for a seeded iterable dataset
        self._data_rng: DataRng | None = None  # keeps main-process reads off training's streams
        self._loader_state: dict[str, Any] | None = None  # a StatefulDataLoader's, batch-exact
        self._pending_loader_state: dict[str, Any] | None = None  # loaded; used by the next pass
        # Accelerate's names: generators given the main process's state at each pass ("torch",
        # "cuda", "generator": the sampler's own generator, which then decides the order).
        self.rng_types: list[str] | None = None
        self.synchronized_generator: torch.Generator | None = None
        self._pass_generator_state: torch.Tensor | None = None  # at the start of the open pass
        # Shared with skip_first_batches copies: they continue one another's passes.
        self._draws = PassDraws(dataloader)
        self._is_skip_copy = False  # made by skip_first_batches: a new loader, as in Accelerate
        self._spent: tuple[Any] | None = None  # loaded in a pass's last batch (`state_dict`)

    # DataLoader's own refuses some names after its __init__, which this class does not run;
    # the plain one also keeps a Python call off each attribute set of a batch.
    __setattr__ = object.__setattr__

    def __getattr__(self, name: str) -> Any:
        # Delegate dataset, batch_size, sampler, ... to the wrapped loader.
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __len__(self) -> int:
        length = len(self.base_dataloader) - self.skip_batches
        return length if self.limit is None else min(length, self.limit)

    @property
    def total_dataset_length(self) -> int:
        """Samples in the dataset, all processes' shares together (Accelerate's name)."""
        dataset = self.base_dataloader.dataset
        return getattr(dataset, "total_length", None) or len(dataset)

    def end_workers(self) -> None:
        """End the worker processes kept between passes (``persistent_workers=True``); the next
        pass starts new ones. As Lightning when a stage ends: left to Python's collector, a
        loader's workers are told to stop after their queues are gone, and each waits out its
        5 s timeout before it is killed, stalling whatever thread collected it."""
        for loader in (self.base_dataloader, self._fetch_loader):
            iterator = getattr(loader, "_iterator", None)
            if iterator is None:
                continue
            stop_workers(iterator)
            loader._iterator = None  # noqa: SLF001 - torch's DataLoader keeps it there

    def set_epoch(self, epoch: int) -> None:
        """Tell the sampler (and the dataset, when it can) which epoch starts, for reshuffling.

        With a ``seed``, the shuffle order and the worker seeds of the epoch are a function of
        ``(seed, epoch)`` alone, so a run resumed mid-epoch sees the same order.
        """
        self._epoch = epoch
        if self.seed is not None:
            self._seed_epoch(self.seed + epoch)
        for obj in (
            getattr(self.base_dataloader, "sampler", None),
            getattr(self.base_dataloader, "batch_sampler", None),
            self.base_dataloader.dataset,
        ):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)

    def _seed_epoch(self, seed: int) -> None:
        loader = self.base_dataloader
        # The workers' base seed, on a stream of its own: mixed, so it is none of the samplers'.
        loader.generator = torch.Generator().manual_seed(batch_seed(seed))
        for sampler in random_samplers(loader):
            # Accelerate's SeedableRandomSampler: seed + epoch, so a data_seed orders alike.
            sampler.generator = torch.Generator().manual_seed(seed)

    @property
    def is_stateful(self) -> bool:
        """Whether the wrapped loader is torchdata's StatefulDataLoader (it keeps its position)."""
        return is_stateful_loader(self.base_dataloader)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: seed and epoch; a StatefulDataLoader's state after the batches
        yielded so far (the read-ahead batch not counted); the synchronized generator's state
        (as the open pass started, else now); whether the epoch's pass has taken its value from
        torch's generator (``trainer/data/draws.py``). Other positions are the Trainer's.

        Taken while the pass's last batch is in use, it also says the pass is spent
        (``pass_spent``, with the generator's state after it): a loop that iterates the loader
        again after loading starts the next epoch, as Accelerate's; the Trainer, which resumes
        that epoch with all its batches skipped, continues it as before."""
        state: dict[str, Any] = {"seed": self.seed, "epoch": self._epoch}
        state.update(self._draws.state_dict(self._epoch))
        if self._loader_state is not None:
            state["loader"] = self._loader_state
        generator = self.synchronized_generator
        if generator is not None:  # an open pass restarts from its start: its order again
            opened = self._pass_generator_state
            state["generator"] = opened.clone() if opened is not None else generator.get_state()
        if self._draws.is_open and self.end_of_dataloader and not self._is_skip_copy:
            state.pop(PASS_OPEN, None)  # a plain pass after loading takes a value afresh
            state[PASS_SPENT] = True
            if generator is not None:
                state["generator_after"] = generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`; a StatefulDataLoader's position is taken by the next pass,
        which then ignores ``skip_batches`` (nothing is read again).

        Raises:
            CheckpointError: ``state`` is several train loaders' (``trainer/data/combined.py``).
        """
        if state.get("combined") is not None:
            raise CheckpointError(
                "the checkpoint's train loader state is for several train loaders read together"
                ", not one. Resume with the train loaders the checkpoint was saved with."
            )
        self.seed = state.get("seed", self.seed)
        self.set_epoch(state.get("epoch", self._epoch))
        self._draws.load_state_dict(state, self._epoch)
        if state.get("loader") is not None and self.is_stateful:
            self._loader_state = self._pending_loader_state = state["loader"]
        if state.get("generator") is not None and self.synchronized_generator is not None:
            set_generator_state(self.synchronized_generator, state["generator"])
            self._pass_generator_state = None
        after = state.get("generator_after") if state.get(PASS_SPENT) else None
        if after is not None:  # checked now, applied when a loop goes on past the spent pass
            set_generator_state(torch.Generator(), after, "generator_after")
        self._spent = (after,) if state.get(PASS_SPENT) else None

    def __iter__(self) -> Iterator[Any]:
        """One pass over the loader; a pass that runs to the end advances the epoch.

        As in Accelerate, each pass starts with ``set_epoch(epoch)`` (with a seed, the shuffle
        order is a function of ``(seed, epoch)`` alone) and a completed pass counts one epoch,
        so a loop that never calls ``set_epoch`` still reshuffles, and a saved position
        replays exactly. The Trainer calls ``set_epoch`` itself before each epoch.
        """
        spent, self._spent = self._spent, None
        if spent is not None and (self._is_skip_copy or self.skip_batches == 0):
            self._epoch += 1  # the loop goes on past the pass the loaded state had spent
            if spent[0] is not None and self.synchronized_generator is not None:
                set_generator_state(self.synchronized_generator, spent[0])
        self.set_epoch(self._epoch)
        self._synchronize_generators()
        self.end_of_dataloader = False
        self.batches_yielded = 0
        skip = self.skip_batches  # a resume's skip applies to one pass; a skip copy's to each
        self.skip_batches = skip if self._is_skip_copy else 0  # (Accelerate's SkipBatchSampler)
        loader, left = self._plan_pass(skip)
        rng = self._data_rng if loader is self._fetch_loader and loader.num_workers == 0 else None
        run = rng.run if rng is not None else _call
        state = self.gradient_state
        is_reading = is_complete = False
        iterator = None
        try:
            iterator = self._open_pass(loader, run, is_resuming=skip > 0)
            for _ in range(left):
                if run(next, iterator, _DONE) is _DONE:
                    return
            limit = math.inf if self.limit is None else self.limit
            if limit <= 0:
                return
            move = self.device is not None and self.device.type != "cpu"
            transform = self.transform
            is_stateful = self.is_stateful
            # The hot path reads ahead itself: no seeded reads, no loader state to take.
            is_plain = run is _call and not is_stateful
            read_ahead = _read_ahead_with_state if is_stateful else _read_ahead
            is_reading = True
            current = run(next, iterator, _DONE)
            while current is not _DONE:
                has_more = self.batches_yielded + 1 < limit
                if is_plain:
                    following = next(iterator, _DONE) if has_more else _DONE
                else:
                    loader_state, following = run(read_ahead, loader, iterator, has_more)
                    if loader_state is not None:  # the state after `current`, for a resume
                        loader_state["_iterator_finished"] = following is _DONE
                        self._loader_state = loader_state
                is_last = following is _DONE
                if is_last:
                    self.end_of_dataloader = True
                if state is not None:
                    active = state.active_dataloaders
                    if active and active[-1] is self:  # `begin_batch` for the active loader
                        state.end_of_dataloader = is_last
                    else:
                        state.begin_batch(self, is_last)
                batch = send_to_device(current, self.device, non_blocking=True) if move else current
                if transform is not None:
                    batch = transform(batch)
                self.batches_yielded += 1
                yield batch
                current = following
            self._epoch += 1  # only a pass that ran to its end (a break closes the generator)
            is_complete = True
        finally:
            if iterator is not None and not getattr(iterator, "_persistent_workers", True):
                stop_workers(iterator)  # a cut pass kept them until the collector found it
            self._draws.end(is_complete=is_complete)
            if is_reading:
                self._pass_generator_state = None
                if state is not None:
                    state.end_iteration(self)

    def _open_pass(
        self, loader: Any, run: Callable[..., Any], *, is_resuming: bool
    ) -> Iterator[Any]:
        """An iterator over ``loader`` (``trainer/data/fetch.py``'s or torch's); the pass's value
        of torch's generator taken (by the iterator without a seed), or none when the pass
        continues a cut one."""
        is_due = self._draws.begin(self._epoch, is_resuming=is_resuming and not self._is_skip_copy)
        if self.seed is not None:  # the loader draws from the seed's own stream
            if is_due:
                take_torch_value(self._draws.generator)
            return run(iterate, loader)
        if not is_due and makes_iterator(loader):
            with drawing_elsewhere(loader):
                return run(iterate, loader)
        return run(iterate, loader)

    def _synchronize_generators(self) -> None:
        """Give ``rng_types`` the main process's state (Accelerate's start of an iteration) and
        remember where the synchronized generator starts this pass."""
        generator = self.synchronized_generator
        if self.rng_types:
            synchronize_rng_states(self.rng_types, generator)
        if generator is not None:
            self._pass_generator_state = generator.get_state()

    def _plan_pass(self, skip: int) -> tuple[DataLoader, int]:
        """The loader this pass reads, and how many of its first batches to read and drop.

        Map-style data skips whole index batches (nothing is loaded for them); iterable data
        and a StatefulDataLoader without a loaded position read them (its state must count
        them); a StatefulDataLoader with a loaded position resumes there by itself.
        """
        base = self.base_dataloader
        seeded = self._seeded_loader()
        loader = base if seeded is None else seeded
        sampler = getattr(loader, "batch_sampler", None)
        if loader is not base:
            forget_generator_states()  # e.g. the Trainer restored them for this epoch
            loader.generator = base.generator  # the workers' base seed follows (seed, epoch)
            if isinstance(sampler, PositionedBatchSampler):
                sampler.seed, sampler.epoch, sampler.skip = self.seed, self._epoch, 0
            if self._stream is not None:
                self._stream.copy_(torch.tensor([self.seed, self._epoch]))
        if self._pending_loader_state is not None:
            loader.load_state_dict(self._pending_loader_state)
            self._pending_loader_state = None
            return loader, 0
        if not skip or is_stateful_loader(loader):
            return loader, skip
        if isinstance(sampler, PositionedBatchSampler):
            sampler.skip = skip
            return loader, 0
        if _can_skip_indices(loader):
            # Skip whole index batches: no sample of the skipped batches is loaded.
            return _skipping(loader, skip), 0
        return loader, skip

    def _seeded_loader(self) -> DataLoader | None:
        """The copy of the loader whose fetches are seeded by their place (built once)."""
        base = self.base_dataloader
        if self.seed is None or not isinstance(base, DataLoader) or draws_nothing(base):
            return None
        if self._fetch_loader is None:
            if isinstance(base.dataset, IterableDataset):
                self._stream = torch.zeros(2, dtype=torch.int64)
                if base.num_workers > 0:
                    self._stream.share_memory_()  # persistent workers read each new epoch
                self._data_rng = DataRng(keeps_stream=True)
                dataset = seeded_dataset(base.dataset, stream=self._stream)
                self._fetch_loader = rebuild_loader(base, dataset=dataset)
            elif base.batch_sampler is not None:
                sampler = PositionedBatchSampler(base.batch_sampler, rank=self.process_index)
                self._data_rng = DataRng(keeps_stream=False)
                dataset = seeded_dataset(base.dataset, main_rng=self._data_rng)
                self._fetch_loader = rebuild_loader(base, dataset=dataset, batch_sampler=sampler)
        return self._fetch_loader

    def copy_skipping(self, num_batches: int) -> DataLoaderShard:
        """A new prepared loader over the same data whose next pass starts at batch
        ``num_batches`` (`skip_first_batches`); it continues a pass of this one cut by a
        loaded save (``trainer/data/draws.py``)."""
        shard = DataLoaderShard(
            self.base_dataloader,
            device=self.device,
            gradient_state=self.gradient_state,
            transform=self.transform,
            skip_batches=num_batches,
            process_index=self.process_index,
        )
        shard.limit, shard.total_batch_size = self.limit, self.total_batch_size
        shard.seed = self.seed
        shard._epoch = self._epoch
        shard.rng_types = self.rng_types
        shard.synchronized_generator = self.synchronized_generator
        shard._draws = self._draws
        shard._is_skip_copy = True
        shard._spent, self._spent = self._spent, None
        return shard

    def __repr__(self) -> str:
        return f"DataLoaderShard({self.base_dataloader!r}, device={self.device})"


_DONE = object()


def _call(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


def _read_ahead(loader: DataLoader, iterator: Iterator[Any], has_more: bool) -> tuple[None, Any]:
    return None, (next(iterator, _DONE) if has_more else _DONE)


def _read_ahead_with_state(
    loader: DataLoader, iterator: Iterator[Any], has_more: bool
) -> tuple[dict[str, Any], Any]:
    # Taken before the next batch is read: a resume must not count the read-ahead batch.
    state = loader.state_dict()
    return state, (next(iterator, _DONE) if has_more else _DONE)


def _can_skip_indices(loader: DataLoader) -> bool:
    return (
        isinstance(loader, DataLoader)
        and not isinstance(loader.dataset, IterableDataset)
        and index_batches_of(loader) is not None
    )


def _skipping(loader: DataLoader, skip: int) -> DataLoader:
    """A one-pass copy of ``loader`` whose first ``skip`` index batches are dropped unread."""
    batches = SkipBatchSampler(index_batches_of(loader), skip)
    return with_index_batches(loader, batches, persistent_workers=False)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """A loader that starts at batch ``num_batches`` of ``dataloader`` (for a mid-epoch resume).

    Works on prepared loaders (the skip applies to their next iteration) and on plain
    DataLoaders (map-style: the batch sampler skips indices without loading them).

    Examples:
        >>> dl = DataLoader(range(10), batch_size=2)
        >>> [b.tolist() for b in skip_first_batches(dl, 3)]
        [[6, 7], [8, 9]]
    """
    if isinstance(dataloader, DataLoaderShard):
        return dataloader.copy_skipping(num_batches)
    if isinstance(dataloader, DataLoader) and not isinstance(dataloader.dataset, IterableDataset):
        if index_batches_of(dataloader) is None:
            raise ConfigurationError(
                "skip_first_batches(dataloader): the DataLoader has batch_size=None, so it has no "
                "batches to skip. Give it a batch_size, a batch_sampler, or a BatchSampler as "
                "its sampler."
            )
        return _skipping(dataloader, num_batches)
    return DataLoaderShard(dataloader).copy_skipping(num_batches)  # skips on every pass
