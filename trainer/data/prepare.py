"""One DataLoader prepared for one process: the code behind ``Accelerator.prepare_data_loader``
and the free ``prepare_data_loader``.

`prepare_loader_shard` takes the process facts as arguments (how many data-parallel shares,
which one is this, how many processes read) and a ``broadcast`` from the main process; it does
not know where they come from — the Accelerator passes its strategy's, the free function the
current process group's. What it decides, with Accelerate's semantics:

- the share: ``trainer/data/sharding.py`` (round-robin batches, ``split_batches``,
  ``even_batches``), and ``remainder`` for ``gather_for_metrics``;
- the shuffle order. With ``use_seedable_sampler`` it is a function of a seed and the epoch
  (``data_seed``, else one draw of torch's global generator, the main process's everywhere).
  Without it, a shuffling sampler that has its own ``torch.Generator`` keeps it: every pass
  starts from the main process's state of that generator, so the global order of index batches
  is the one a plain DataLoader gives on one process, split across the processes. Other
  shuffled loaders, and iterable datasets (every process reads the whole stream), read by
  several processes get a seed as with ``use_seedable_sampler``, so every process draws alike.
  An unshuffled map-style loader gets none: as in Accelerate, each process reads its share as
  the plain DataLoader would, and takes nothing from torch's generator at ``prepare``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.data.draws import random_samplers
from trainer.data.loader import DataLoaderShard
from trainer.data.rebuild import index_batches_of, to_stateful_loader
from trainer.data.sharding import shard_data_loader
from trainer.errors import ConfigurationError
from trainer.runtime.configs import DataLoaderConfiguration
from trainer.runtime.gradient_state import GradientState

__all__ = ["own_generator", "prepare_loader_shard"]


def own_generator(loader: DataLoader) -> torch.Generator | None:
    """The ``torch.Generator`` the loader's sampler shuffles with, if the user gave it one.

    ``DataLoader(..., shuffle=True, generator=g)`` gives its ``RandomSampler`` ``g``; a sampler
    built with ``generator=g`` has it too. Iterable datasets have no sampler: None.
    """
    if isinstance(loader.dataset, IterableDataset):
        return None
    sampler = getattr(index_batches_of(loader), "sampler", None)
    generator = getattr(sampler, "generator", None)
    return generator if isinstance(generator, torch.Generator) else None


def _is_drawn_alike(loader: DataLoader) -> bool:
    """Whether processes must draw alike to split ``loader``: it shuffles (its sampler has a
    ``generator`` attribute, Accelerate's test, or a RandomSampler is deeper down), or it is an
    iterable dataset that every process reads whole."""
    if isinstance(loader.dataset, IterableDataset):
        return True
    sampler = getattr(index_batches_of(loader), "sampler", None)
    return hasattr(sampler, "generator") or bool(random_samplers(loader))


def _shuffle_seed(
    config: DataLoaderConfiguration, broadcast: Callable[[torch.Tensor], torch.Tensor]
) -> int:
    if config.use_seedable_sampler and config.data_seed is not None:
        return config.data_seed
    # Drawn from the global generator, so torch.manual_seed(...) before prepare decides it; the
    # main process's draw is used everywhere, so every process shuffles alike.
    seed = torch.randint(0, 2**31 - 1, (1,))
    return int(broadcast(seed).item())


def prepare_loader_shard(
    loader: DataLoader,
    *,
    num_processes: int,
    process_index: int,
    world_size: int,
    config: DataLoaderConfiguration,
    broadcast: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device | None = None,
    gradient_state: GradientState | None = None,
    transform: Callable[[Any], Any] | None = None,
    rng_types: list[str] | None = None,
) -> DataLoaderShard:
    """``loader`` prepared for this process (see the module docstring).

    Args:
        loader: the user's DataLoader.
        num_processes: data-parallel shares to split it into (1: this process reads it all).
        process_index: this process's share.
        world_size: processes that read the loader (they must agree on the shuffle order).
        config: the ``DataLoaderConfiguration`` options.
        broadcast: sends the main process's tensor to every process (identity on one).
        device: where batches go; None leaves them where the loader puts them.
        gradient_state: told of each batch and of the end of the data.
        transform: applied to each batch after the move (the precision's input cast).
        rng_types: generators given the main process's state at each pass; "generator" is the
            sampler's own generator.

    Returns:
        The prepared loader.
    """
    if isinstance(loader, DataLoaderShard):
        raise ConfigurationError(
            f"prepare: {loader!r} was prepared already (it holds one process's share). Use it "
            "as it is, or prepare the DataLoader you built (its base_dataloader is a share too)."
        )
    if config.use_stateful_dataloader:
        loader = to_stateful_loader(loader)
    generator = None if config.use_seedable_sampler else own_generator(loader)
    is_drawn_alike = max(num_processes, world_size) > 1 and _is_drawn_alike(loader)
    remainder, batch_size = -1, loader.batch_size
    if batch_size is None:  # a batch sampler of the user's
        batch_size = getattr(loader.batch_sampler, "batch_size", None)
    if num_processes > 1:
        loader, remainder = shard_data_loader(
            loader, num_processes=num_processes, process_index=process_index, config=config
        )
    prepared = DataLoaderShard(
        loader,
        device=device,
        gradient_state=gradient_state,
        transform=transform,
        process_index=process_index,
    )
    prepared.remainder = remainder
    if batch_size is not None and not config.split_batches:
        batch_size *= num_processes
    prepared.total_batch_size = batch_size
    prepared.rng_types = list(rng_types) if rng_types is not None else None
    if generator is not None:
        prepared.synchronized_generator = generator
    elif config.use_seedable_sampler or is_drawn_alike:
        prepared.seed = _shuffle_seed(config, broadcast)
        prepared.set_epoch(0)
    return prepared
