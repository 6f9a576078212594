"""Prepared dataloaders: device placement, end-of-data lookahead, batch skipping and limits.

`DataLoaderShard` wraps a user's DataLoader for one process. It looks one batch ahead so
that the Accelerator knows, while the last batch is being used, that it is the last (gradient
accumulation syncs there; ``gather_for_metrics`` trims there). Sharding across processes is
decided by the strategy's ``distributed_sampler_kwargs`` and lives in ``trainer/data/sharding.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from trainer.errors import ConfigurationError

__all__ = ["DataLoaderShard", "SkipBatchSampler", "send_to_device", "skip_first_batches"]


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a nested batch (dict, list, tuple, namedtuple) to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, dict):
        return type(data)({k: send_to_device(v, device, non_blocking) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(send_to_device(v, device, non_blocking) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(send_to_device(v, device, non_blocking) for v in data)
    if hasattr(data, "to") and callable(data.to):  # e.g. transformers' BatchEncoding
        return data.to(device)
    return data


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


class DataLoaderShard:
    """A DataLoader prepared for one process.

    Args:
        dataloader: the user's DataLoader (already sharded for this process).
        device: where batches go, or None to leave them where the loader puts them.
        gradient_state: told of each batch (``begin_batch(shard, is_last)``) and of the end.
        transform: applied to each batch after the move (the precision plugin's input cast).
        skip_batches: batches to drop at the start of the next iteration (mid-epoch resume).
    """

    def __init__(
        self,
        dataloader: DataLoader,
        *,
        device: torch.device | None = None,
        gradient_state: Any | None = None,
        transform: Callable[[Any], Any] | None = None,
        skip_batches: int = 0,
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
        self.seed: int | None = None  # set: shuffle order and worker seeds follow (seed, epoch)
        self._epoch = 0

    def __getattr__(self, name: str) -> Any:
        # Delegate dataset, batch_size, sampler, ... to the wrapped loader.
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __len__(self) -> int:
        length = len(self.base_dataloader) - self.skip_batches
        return length if self.limit is None else min(length, self.limit)

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
        loader.generator = torch.Generator().manual_seed(seed)  # workers' base seed
        for sampler in _random_samplers(loader):
            sampler.generator = torch.Generator().manual_seed(seed + 1)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: its seed and epoch (the batch position is the Trainer's)."""
        return {"seed": self.seed, "epoch": self._epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = state.get("seed", self.seed)
        self.set_epoch(state.get("epoch", self._epoch))

    def __iter__(self) -> Iterator[Any]:
        """One pass over the loader; a pass that runs to the end advances the epoch.

        As in Accelerate, each pass starts with ``set_epoch(epoch)`` (with a seed, the shuffle
        order is a function of ``(seed, epoch)`` alone) and a completed pass counts one epoch,
        so a loop that never calls ``set_epoch`` still reshuffles, and a saved position
        replays exactly. The Trainer calls ``set_epoch`` itself before each epoch.
        """
        self.set_epoch(self._epoch)
        self.end_of_dataloader = False
        self.batches_yielded = 0
        skip, self.skip_batches = self.skip_batches, 0  # a skip applies to one iteration only
        loader = self.base_dataloader
        if skip and _can_skip_indices(loader):
            # Skip whole index batches: no sample of the skipped batches is loaded.
            loader = _with_batch_sampler(loader, SkipBatchSampler(loader.batch_sampler, skip))
            skip = 0
        iterator = iter(loader)
        for _ in range(skip):
            if next(iterator, _DONE) is _DONE:
                return
        limit = math.inf if self.limit is None else self.limit
        if limit <= 0:
            return
        state = self.gradient_state
        move = self.device is not None and self.device.type != "cpu"
        transform = self.transform
        try:
            current = next(iterator, _DONE)
            while current is not _DONE:
                following = _DONE if self.batches_yielded + 1 >= limit else next(iterator, _DONE)
                is_last = following is _DONE
                if is_last:
                    self.end_of_dataloader = True
                if state is not None:
                    state.begin_batch(self, is_last)
                batch = send_to_device(current, self.device, non_blocking=True) if move else current
                if transform is not None:
                    batch = transform(batch)
                self.batches_yielded += 1
                yield batch
                current = following
            self._epoch += 1  # only a pass that ran to its end (a break closes the generator)
        finally:
            if state is not None:
                state.end_iteration(self)

    def __repr__(self) -> str:
        return f"DataLoaderShard({self.base_dataloader!r}, device={self.device})"


_DONE = object()


def _random_samplers(loader: DataLoader) -> list[RandomSampler]:
    """The RandomSamplers a loader draws from, also inside (sharded) batch samplers."""
    found, pending, seen = [], [loader.sampler, loader.batch_sampler], set()
    while pending:
        obj = pending.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, RandomSampler):
            found.append(obj)
        pending += [getattr(obj, "sampler", None), getattr(obj, "batch_sampler", None)]
    return found


def _can_skip_indices(loader: DataLoader) -> bool:
    return (
        isinstance(loader, DataLoader)
        and not isinstance(loader.dataset, IterableDataset)
        and loader.batch_sampler is not None
    )


def _with_batch_sampler(loader: DataLoader, batch_sampler: Sampler[list[int]]) -> DataLoader:
    """A copy of ``loader`` drawing its index batches from ``batch_sampler``."""
    return DataLoader(
        loader.dataset,
        batch_sampler=batch_sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=False,
        in_order=getattr(loader, "in_order", True),
    )


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
        shard = DataLoaderShard(
            dataloader.base_dataloader,
            device=dataloader.device,
            gradient_state=dataloader.gradient_state,
            transform=dataloader.transform,
            skip_batches=num_batches,
        )
        shard.limit = dataloader.limit
        shard.seed = dataloader.seed
        shard._epoch = dataloader._epoch
        return shard
    if isinstance(dataloader, DataLoader) and not isinstance(dataloader.dataset, IterableDataset):
        if dataloader.batch_sampler is None:
            raise ConfigurationError(
                "skip_first_batches(dataloader): the DataLoader has batch_size=None, so it has no "
                "batches to skip. Give it a batch_size or a batch_sampler."
            )
        return _with_batch_sampler(
            dataloader, SkipBatchSampler(dataloader.batch_sampler, num_batches)
        )
    return DataLoaderShard(dataloader, skip_batches=num_batches)
