"""Reading a DataLoader's batches in this process with fewer calls per batch than torch's.

torch's single-process iterator makes every ``next`` a profiler record
(``torch.autograd.profiler.record_function``, about 5 µs on 2026's CPUs, made whether or not a
profiler is running) and four more Python calls before it reaches the dataset. For the common
loader — map-style data, batches of indices, no workers, no pinning — `iterate` gives the same
batches from the same calls to the sampler, the dataset and ``collate_fn``, and the same draw
from the loader's generator, without them; the record is still made while a profiler runs, so
traces read the same. Any other loader is iterated by torch itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.data.draws import take_torch_value

__all__ = ["is_read_here", "iterate", "makes_iterator"]

_PROFILE_NAME = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"  # torch's name
# Whether the autograd profiler is on (torch.profiler's too): torch has no public name for it.
_profiler_enabled = torch._C._autograd._profiler_enabled  # noqa: SLF001


def is_read_here(loader: Any) -> bool:
    """Whether `iterate` reads ``loader`` itself: a plain DataLoader of map-style data batched by
    a batch sampler, read in this process (no workers), without pinned memory."""
    return (
        type(loader) is DataLoader
        and loader.num_workers == 0
        and loader.timeout == 0  # torch refuses a timeout without workers: left to say so
        and loader.batch_sampler is not None
        and not loader.pin_memory
        and not isinstance(loader.dataset, IterableDataset)
        and not _is_data_pipe(loader.dataset)
    )


def iterate(loader: Any) -> Iterator[Any]:
    """``iter(loader)``, read here when `is_read_here` (see the module docstring)."""
    if not is_read_here(loader):
        return iter(loader)
    # torch's iterator, when made: the batch sampler's iterator first, then its base-seed draw.
    index_batches = iter(loader.batch_sampler)
    take_torch_value(loader.generator)
    return _batches(loader.dataset, index_batches, loader.collate_fn)


def makes_iterator(loader: Any) -> bool:
    """Whether ``iter(loader)`` makes a new iterator (which draws its value): persistent
    workers keep theirs from pass to pass."""
    if not isinstance(loader, DataLoader):
        return False
    is_persistent = loader.persistent_workers and loader.num_workers > 0
    return not is_persistent or getattr(loader, "_iterator", None) is None


def _batches(
    dataset: Any, index_batches: Iterator[Any], collate: Callable[[Any], Any]
) -> Iterator[Any]:
    get_items = getattr(dataset, "__getitems__", None) or None
    try:
        for indices in index_batches:
            if _profiler_enabled():
                with torch.autograd.profiler.record_function(_PROFILE_NAME):
                    batch = _fetch(dataset, get_items, indices, collate)
            elif get_items is None:  # `_fetch` inline: one call less per batch
                batch = collate([dataset[index] for index in indices])
            else:
                batch = collate(get_items(indices))
            yield batch
    except StopIteration:  # a dataset may end a pass this way, as torch's fetcher allows
        return


def _fetch(
    dataset: Any,
    get_items: Callable[[Any], Any] | None,
    indices: Any,
    collate: Callable[[Any], Any],
) -> Any:
    return collate(get_items(indices) if get_items is not None else [dataset[i] for i in indices])


def _is_data_pipe(dataset: Any) -> bool:
    data_pipe = getattr(torch.utils.data, "MapDataPipe", None)
    return data_pipe is not None and isinstance(dataset, data_pipe)
