"""Copies of a DataLoader with another dataset or batch sampler, and torchdata's StatefulDataLoader.

Sharding, skipping and seeded fetching each need the user's loader with one part replaced. The
copy keeps every other setting (workers, ``worker_init_fn``, collate, pinning, prefetching,
persistence) and the class when it is torchdata's ``StatefulDataLoader``. torchdata is optional:
it is imported only to build a StatefulDataLoader from a plain one
(``DataLoaderConfiguration(use_stateful_dataloader=True)``); recognising one never imports it.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset

from trainer._imports import require

__all__ = [
    "index_batches_of",
    "is_stateful_loader",
    "rebuild_loader",
    "stateful_sampler_types",
    "to_stateful_loader",
    "with_index_batches",
]

_STATEFUL_MODULE = "torchdata.stateful_dataloader"
_UNSET: Any = object()


def is_stateful_loader(loader: Any) -> bool:
    """Whether ``loader`` is torchdata's ``StatefulDataLoader`` (never imports torchdata)."""
    module = sys.modules.get(_STATEFUL_MODULE)
    return module is not None and isinstance(loader, module.StatefulDataLoader)


def stateful_sampler_types() -> tuple[type, ...]:
    """torchdata's own RandomSampler (a StatefulDataLoader's default), once torchdata is loaded."""
    module = sys.modules.get(f"{_STATEFUL_MODULE}.sampler")
    return (module.RandomSampler,) if module is not None else ()


def rebuild_loader(
    loader: DataLoader,
    *,
    dataset: Dataset | None = None,
    batch_sampler: Any = _UNSET,
    sampler: Any = _UNSET,
    batch_size: int | None = None,
    persistent_workers: bool | None = None,
    stateful: bool | None = None,
) -> DataLoader:
    """A copy of ``loader`` reading ``dataset`` through ``batch_sampler`` (or ``batch_size``).

    Args:
        loader: the loader whose other settings are kept.
        dataset: the new dataset (default: the loader's).
        batch_sampler: the new index batches of a map-style dataset (default: the loader's).
        sampler: for a loader without a batch sampler (``batch_size=None``), what it draws
            each read from (default: the loader's), e.g. whole index batches.
        batch_size: for an iterable dataset, the new batch size (default: the loader's).
        persistent_workers: default: the loader's.
        stateful: build torchdata's StatefulDataLoader (default: when ``loader`` is one).
    """
    dataset = loader.dataset if dataset is None else dataset
    stateful = is_stateful_loader(loader) if stateful is None else stateful
    options: dict[str, Any] = dict(
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers
        if persistent_workers is None
        else persistent_workers,
    )
    if not getattr(loader, "in_order", True):  # older torchdata has no such argument
        options["in_order"] = False
    if loader.num_workers == 0:  # DataLoader refuses these without workers
        options["persistent_workers"] = False
    if isinstance(dataset, IterableDataset):
        options.update(
            batch_size=loader.batch_size if batch_size is None else batch_size,
            drop_last=loader.drop_last,
        )
    else:
        options["batch_sampler"] = (
            loader.batch_sampler if batch_sampler is _UNSET else batch_sampler
        )
        if options["batch_sampler"] is None:  # batch_size=None: one read per sampler item
            options.update(
                batch_size=None, sampler=loader.sampler if sampler is _UNSET else sampler
            )
    if stateful:
        module = require(_STATEFUL_MODULE, extra="stateful", feature="StatefulDataLoader")
        snapshot_every = getattr(loader, "snapshot_every_n_steps", 1)
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            return module.StatefulDataLoader(
                dataset, snapshot_every_n_steps=snapshot_every, **options
            )
    return DataLoader(dataset, **options)


def index_batches_of(loader: DataLoader) -> Any:
    """What yields ``loader``'s index batches: its batch sampler, or a ``BatchSampler`` given as
    its ``sampler`` with ``batch_size=None`` (each read is then a whole batch); else None."""
    if loader.batch_sampler is not None:
        return loader.batch_sampler
    return loader.sampler if isinstance(loader.sampler, BatchSampler) else None


def with_index_batches(loader: DataLoader, index_batches: Any, **options: Any) -> DataLoader:
    """A copy of ``loader`` whose index batches come from ``index_batches``, in the place the
    loader had them (``batch_sampler``, or ``sampler`` when it reads whole batches)."""
    if loader.batch_sampler is None:
        return rebuild_loader(loader, batch_sampler=None, sampler=index_batches, **options)
    return rebuild_loader(loader, batch_sampler=index_batches, **options)


def to_stateful_loader(loader: DataLoader) -> DataLoader:
    """``loader`` as torchdata's ``StatefulDataLoader`` (itself if it is one already).

    Raises:
        MissingDependencyError: torchdata is not installed (``pip install 'trainer[stateful]'``).
    """
    if is_stateful_loader(loader):
        return loader
    return rebuild_loader(loader, stateful=True)
