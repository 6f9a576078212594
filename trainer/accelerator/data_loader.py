"""``prepare_data_loader``: Accelerate's ``accelerate.data_loader.prepare_data_loader``, no
Accelerator needed.

It reads the process facts from the current process group (`current_strategy`, or the
``num_processes`` / ``process_index`` given) and hands the rest to the code
``Accelerator.prepare`` uses for loaders (``trainer.data.prepare``), so both prepare a loader
alike. The loader it returns tracks its own end of data (``loader.gradient_state``); it is not
tied to any Accelerator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.accelerator.operations import current_strategy
from trainer.data.loader import DataLoaderShard
from trainer.data.prepare import prepare_loader_shard
from trainer.errors import ConfigurationError, describe
from trainer.runtime.configs import DataLoaderConfiguration
from trainer.runtime.gradient_state import GradientState

__all__ = ["prepare_data_loader"]


def _mesh_size(mesh: Any, name: str) -> int:
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh[name].size() if name in names else 1


def _data_parallel_place(mesh: Any, process_index: int) -> tuple[int, int]:
    """``(num_processes, process_index)`` over the data-parallel dimensions of ``mesh``:
    tensor- and context-parallel peers read the same batches (Accelerate's rule)."""
    peers = _mesh_size(mesh, "tp") * _mesh_size(mesh, "cp")
    replicas = _mesh_size(mesh, "dp_replicate") * _mesh_size(mesh, "dp_shard")
    return replicas, process_index // peers


def _check_place(num_processes: Any, process_index: Any) -> None:
    for name, value, low in (
        ("num_processes", num_processes, 1),
        ("process_index", process_index, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigurationError(
                f"prepare_data_loader({name}={describe(value)}): expected an int >= {low}."
            )
    if process_index >= num_processes:
        raise ConfigurationError(
            f"prepare_data_loader(process_index={process_index}): expected an index below "
            f"num_processes={num_processes}. Pass 0 to {num_processes - 1}."
        )


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoaderShard:
    """Wrap ``dataloader`` so this process reads its share of every global batch.

    The options mean what they mean in ``DataLoaderConfiguration`` and in Accelerate. With 2
    processes and ``DataLoader(range(8), batch_size=2)``, process 0 reads ``[0, 1]``, ``[4, 5]``
    and process 1 ``[2, 3]``, ``[6, 7]``. Every process reads its own share, so
    ``dispatch_batches`` gives the same batches as without it and ``slice_fn_for_dispatch`` is
    not used.

    Args:
        dataloader: the DataLoader to share out.
        device: where batches go when ``put_on_device``.
        num_processes: the number of shares; default: the processes of the current group.
        process_index: this process's share; default: its rank.
        split_batches: the loader's batch is the global one, split across the processes.
        put_on_device: move every batch to ``device``.
        rng_types: generators given the main process's state at each pass ("torch", "cuda",
            "generator": the sampler's own generator).
        dispatch_batches: Accelerate's central reading; needs ``put_on_device=True``.
        even_batches: complete the last round with samples from the start.
        slice_fn_for_dispatch: Accelerate's slicing of dispatched batches (not used).
        use_seedable_sampler: shuffle as a function of a seed and the epoch.
        data_seed: that seed (default: drawn from torch's global generator).
        non_blocking: copy batches to the device asynchronously.
        use_stateful_dataloader: read through torchdata's ``StatefulDataLoader``.
        torch_device_mesh: a ``DeviceMesh``; only its data-parallel dimensions share the data.

    Returns:
        A ``DataLoaderShard``.

    Raises:
        ConfigurationError: ``dataloader`` is not a DataLoader, a bad process place, or
            ``dispatch_batches=True`` without ``put_on_device=True``.
    """
    if not isinstance(dataloader, DataLoader):
        raise ConfigurationError(
            f"prepare_data_loader(dataloader={describe(dataloader)}): expected a "
            "torch.utils.data.DataLoader. Wrap your dataset: DataLoader(dataset, batch_size=32)."
        )
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ConfigurationError(
            "prepare_data_loader(dispatch_batches=True) needs put_on_device=True (as in "
            "Accelerate). Pass put_on_device=True, or leave dispatch_batches unset."
        )
    strategy = current_strategy()
    num_processes = strategy.world_size if num_processes is None else num_processes
    process_index = strategy.global_rank if process_index is None else process_index
    if torch_device_mesh is not None:
        num_processes, process_index = _data_parallel_place(torch_device_mesh, process_index)
    _check_place(num_processes, process_index)
    config = DataLoaderConfiguration(
        split_batches=split_batches,
        dispatch_batches=dispatch_batches,
        even_batches=even_batches,
        use_seedable_sampler=use_seedable_sampler,
        data_seed=data_seed,
        non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader,
    )
    return prepare_loader_shard(
        dataloader,
        num_processes=num_processes,
        process_index=process_index,
        world_size=strategy.world_size,
        config=config,
        broadcast=lambda tensor: strategy.broadcast(tensor, src=0),
        device=torch.device(device) if put_on_device and device is not None else None,
        gradient_state=GradientState(),
        rng_types=rng_types,
    )
