"""The dataset indices of each batch a prepared loader yields (Lightning's ``batch_indices``).

``trainer.predict`` hands a `BasePredictionWriter` the indices of every batch's samples, so
predictions written by several processes, or from a shuffled loader, can be put back in the
dataset's order. `record_indices` makes a prepared loader read through an `IndexRecorder`: the
batch sampler this process actually uses (after sharding and seeding) remembers each index
batch it gives out, and the loop takes them back in the same order, one per batch yielded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from trainer.data.rebuild import rebuild_loader

__all__ = ["IndexRecorder", "record_indices"]


class IndexRecorder:
    """A batch sampler that remembers the index batches it yields until they are taken.

    The DataLoader draws index batches ahead of the batches it returns (read-ahead, workers),
    always in order, so the oldest remembered batch is the one being returned.
    """

    def __init__(self, batch_sampler: Iterable[Any]) -> None:
        self.batch_sampler = batch_sampler
        self._pending: deque[list[int]] = deque()

    def __iter__(self) -> Iterator[Any]:
        self._pending.clear()  # a new pass
        for batch in self.batch_sampler:
            self._pending.append([int(index) for index in batch])
            yield batch

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # batch_size, drop_last, sampler ...
        if name == "batch_sampler":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)

    def take(self) -> list[int] | None:
        """The indices of the oldest batch not yet taken; None when there is none."""
        return self._pending.popleft() if self._pending else None


def record_indices(prepared: Any) -> IndexRecorder | None:
    """Make ``prepared`` (a `DataLoaderShard`) read through an `IndexRecorder` and return it;
    None for a loader without index batches (an iterable dataset, ``batch_size=None``)."""
    base = prepared.base_dataloader
    batch_sampler = getattr(base, "batch_sampler", None)
    if batch_sampler is None:
        return None
    recorder = IndexRecorder(batch_sampler)
    prepared.base_dataloader = rebuild_loader(base, batch_sampler=recorder)
    return recorder
