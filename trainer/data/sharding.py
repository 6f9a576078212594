"""Give each of N processes its part of a DataLoader, with Accelerate's semantics.

Map-style data: the global order of index batches is computed identically on every process (the
sampler is seeded the same everywhere) and dealt round-robin — process ``p`` gets batches
``p, p+N, p+2N, ...``; with ``split_batches=True`` each batch is the global batch and process
``p`` gets slice ``p`` of it. With ``even_batches=True`` the last round is completed with samples
from the start, so every process steps the same number of times with full batches; the number of
real samples in the last gathered batch (``remainder``, also with ``even_batches=False``, as
Accelerate's) lets ``gather_for_metrics`` drop the duplicates (or the padding a user added with
``pad_across_processes``). A ``BatchSampler`` given as the loader's ``sampler`` (``batch_size=None``: the dataset
reads a whole batch of indices at once) is sharded the same way. Iterable data: every process
reads the stream and keeps its share of each chunk.

Example (2 processes, batch size 5, 9 samples, even_batches): process 0 gets [0..4], process 1
gets [5, 6, 7, 8, 0]; gathering the last batch gives 10 rows and ``remainder`` 9 keeps 9.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from trainer.data.rebuild import index_batches_of, rebuild_loader, with_index_batches
from trainer.errors import ConfigurationError
from trainer.runtime.configs import DataLoaderConfiguration

__all__ = ["BatchSamplerShard", "IterableDatasetShard", "shard_data_loader"]


class BatchSamplerShard(BatchSampler):
    """This process's index batches from ``batch_sampler`` (see module docstring)."""

    def __init__(
        self,
        batch_sampler: Sampler[list[int]],
        num_processes: int,
        process_index: int,
        *,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        if split_batches and self.batch_size is not None and self.batch_size % num_processes:
            raise ConfigurationError(
                f"split_batches=True: the batch size {self.batch_size} does not divide among {num_processes} "
                f"processes. Use a multiple of {num_processes}."
            )

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    def _global_batches(self) -> list[list[int]]:
        batches = [list(batch) for batch in self.batch_sampler]
        if not self.even_batches or self.drop_last or not batches:
            return batches
        per_round = 1 if self.split_batches else self.num_processes
        size = self.batch_size or len(batches[0])
        flat = [index for batch in batches for index in batch]
        rounds = math.ceil(len(flat) / (per_round * size))
        needed = rounds * per_round * size
        padded = flat + [flat[i % len(flat)] for i in range(needed - len(flat))]
        return [padded[i : i + size] for i in range(0, needed, size)]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._global_batches()
        if self.split_batches:
            # Slices of batch_size / N, as Accelerate: a short last batch (even_batches=False)
            # goes to the first processes whole-slice by whole-slice, the others get nothing.
            size = self.batch_size
            for batch in batches:
                part = (
                    size // self.num_processes
                    if size
                    else math.ceil(len(batch) / self.num_processes)
                )
                piece = batch[self.process_index * part : (self.process_index + 1) * part]
                if piece:
                    yield piece
            return
        if self.drop_last:
            batches = batches[: len(batches) // self.num_processes * self.num_processes]
        yield from batches[self.process_index :: self.num_processes]

    def __len__(self) -> int:
        total = len(self.batch_sampler)  # type: ignore[arg-type]
        if self.split_batches:
            return total
        if self.drop_last:
            return total // self.num_processes
        if self.even_batches:
            return math.ceil(total / self.num_processes)
        return total // self.num_processes + (
            1 if self.process_index < total % self.num_processes else 0
        )

    def set_epoch(self, epoch: int) -> None:
        for obj in (self.batch_sampler, self.sampler):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)


class IterableDatasetShard(IterableDataset):
    """This process's share of an iterable dataset: slice ``p`` of each chunk of ``size * N``."""

    def __init__(
        self,
        dataset: IterableDataset,
        batch_size: int,
        num_processes: int,
        process_index: int,
        *,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches

    def __iter__(self) -> Iterator[Any]:
        chunk_size = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        share = chunk_size // self.num_processes
        start, end = self.process_index * share, (self.process_index + 1) * share
        first: list[Any] = []
        chunk: list[Any] = []
        for item in self.dataset:
            chunk.append(item)
            if len(first) < chunk_size:
                first.append(item)
            if len(chunk) == chunk_size:
                yield from chunk[start:end]
                chunk = []
        if chunk:
            if self.even_batches:
                while len(chunk) < chunk_size:
                    chunk += first[: chunk_size - len(chunk)]
                yield from chunk[start:end]
            else:
                yield from chunk[start:end]

    def __len__(self) -> int:
        length = len(self.dataset)  # type: ignore[arg-type]
        chunk_size = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        return math.ceil(length / chunk_size) * (chunk_size // self.num_processes)

    @property
    def total_length(self) -> int:
        """Samples in the whole dataset, every process's share (``total_dataset_length``)."""
        return len(self.dataset)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)


def _dataset_length(loader: DataLoader) -> int | None:
    try:
        return len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        return None


def shard_data_loader(
    loader: DataLoader, *, num_processes: int, process_index: int, config: DataLoaderConfiguration
) -> tuple[DataLoader, int]:
    """A DataLoader over this process's share, and the real samples of the last gathered batch.

    The second value is ``-1`` when the last gathered batch has no duplicates to drop.
    """
    length = _dataset_length(loader)
    if isinstance(loader.dataset, IterableDataset):
        if loader.batch_size is None:
            raise ConfigurationError(
                "prepare: an iterable dataset needs a DataLoader batch_size to be sharded."
            )
        shard = IterableDatasetShard(
            loader.dataset,
            loader.batch_size,
            num_processes,
            process_index,
            split_batches=config.split_batches,
            even_batches=config.even_batches,
        )
        per_process = (
            loader.batch_size // num_processes if config.split_batches else loader.batch_size
        )
        if config.split_batches and loader.batch_size % num_processes:
            raise ConfigurationError(
                f"split_batches=True: the batch size {loader.batch_size} does not divide among {num_processes} processes."
            )
        sharded = rebuild_loader(loader, dataset=shard, batch_size=per_process)
        global_batch = (
            loader.batch_size if config.split_batches else loader.batch_size * num_processes
        )
    else:
        index_batches = index_batches_of(loader)
        if index_batches is None:
            raise ConfigurationError(
                "prepare: a DataLoader with batch_size=None cannot be sharded; give it a "
                "batch_size, or a BatchSampler as its sampler."
            )
        batch_sampler = BatchSamplerShard(
            index_batches,
            num_processes,
            process_index,
            split_batches=config.split_batches,
            even_batches=config.even_batches,
        )
        sharded = with_index_batches(loader, batch_sampler)
        size = getattr(index_batches, "batch_size", None) or 1
        global_batch = size if config.split_batches else size * num_processes
    if length is None or loader.drop_last:
        return sharded, -1
    remainder = length % global_batch
    return sharded, remainder if remainder else -1
