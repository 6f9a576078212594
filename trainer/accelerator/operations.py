"""Accelerate's distributed operations as free functions (``accelerate.utils.operations``).

``from trainer import gather, reduce, ...`` replaces ``from accelerate.utils import gather,
reduce, ...``. Each works on a tensor or a nest of lists, tuples, dicts and namedtuples of
tensors, over the current process group — no Accelerator and no ``strategy`` argument — and is
the identity with one process. They are the Accelerator's collectives
(``trainer.accelerator.collectives``) run on `current_strategy`, so a free ``gather`` and
``accelerator.gather`` give the same result.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.accelerator import collectives
from trainer.runtime.state import PartialState
from trainer.strategies import Strategy, detect_environment

__all__ = [
    "broadcast",
    "broadcast_object_list",
    "current_strategy",
    "gather",
    "gather_object",
    "pad_across_processes",
    "reduce",
    "wait_for_everyone",
]

_SINGLE = Strategy("cpu")  # the one-process identities (the collectives use the tensors' device)


def current_strategy() -> Strategy:
    """The collectives of this process: DDP's over the default process group when it spans
    several processes, else the one-process identities.

    A process that a launcher (torchrun, SLURM) started among several joins their process group
    here if nothing has yet — as Accelerate's ``PartialState()`` does — so a free function never
    acts as if it were alone when it is not. Built per call (a few microseconds), so no process
    group is held here after it ends.
    """
    is_up = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not is_up and not detect_environment().is_distributed:
        return _SINGLE
    from trainer.strategies.ddp import DDPStrategy

    strategy = DDPStrategy("cuda" if PartialState().device.type == "cuda" else "cpu")
    strategy.setup_environment()  # joins the launcher's group unless one is up
    return strategy if strategy.world_size > 1 else _SINGLE


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Every process gets process ``from_process``'s ``tensor`` (or nest of tensors).

    Args:
        tensor: a tensor, or a nest of them; the same shapes on every process.
        from_process: the process whose values are sent.

    Returns:
        The same structure holding ``from_process``'s values: with 2 processes each holding
        ``tensor([rank])``, ``tensor([0])`` on both.
    """
    return collectives.broadcast(current_strategy(), tensor, from_process)


def gather(tensor: Any) -> Any:
    """Concatenate ``tensor`` (or each tensor of a nest) from every process along dim 0.

    Args:
        tensor: a tensor or a nest of them; the same shapes on every process (see
            `pad_across_processes`). A 0-dim tensor counts as shape ``(1,)``.

    Returns:
        The same structure; with 2 processes and shape ``(3, 4)`` each tensor is ``(6, 4)``.
    """
    return collectives.gather(current_strategy(), tensor)


def gather_object(object: Any) -> Any:  # Accelerate names the argument `object`
    """Every process's picklable ``object``, as one list in rank order.

    Args:
        object: a list or tuple (concatenated across processes) or any picklable value (one
            item per process).

    Returns:
        With 2 processes, ``[rank]`` on each gives ``[0, 1]``; with one process, ``object``.
    """
    return collectives.gather_object(current_strategy(), object)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Fill ``object_list`` in place with process ``from_process``'s items (any picklable).

    Args:
        object_list: a list; its items are replaced.
        from_process: the process whose items are sent.

    Returns:
        ``object_list``.

    Raises:
        ConfigurationError: ``object_list`` is not a list.
    """
    return collectives.broadcast_object_list(current_strategy(), object_list, from_process)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce ``tensor`` (or each tensor of a nest) over the processes; every process gets it.

    Args:
        tensor: a tensor or a nest of them.
        reduction: "mean", "sum", "max", "min", or "none" (returned as it is).
        scale: multiplies the result.

    Returns:
        The same structure; with 2 processes holding ``[1., 2.]`` and ``[3., 4.]``, "mean" gives
        ``[2., 3.]`` and "max" ``[3., 4.]`` on both.

    Raises:
        ConfigurationError: an unknown ``reduction``.
    """
    return collectives.reduce(current_strategy(), tensor, reduction, scale)


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad ``tensor`` (or each tensor of a nest) along ``dim`` to the largest size on any process.

    Args:
        tensor: a tensor or a nest of them.
        dim: the dimension to pad; a tensor without it is returned as it is.
        pad_index: the value padded in.
        pad_first: pad before the data instead of after it.

    Returns:
        The same structure; shapes ``(2, 5)`` and ``(3, 5)`` both become ``(3, 5)``.
    """
    return collectives.pad_across_processes(
        current_strategy(), tensor, dim=dim, pad_index=pad_index, pad_first=pad_first
    )


def wait_for_everyone() -> None:
    """Block until every process reaches this point (nothing with one process)."""
    current_strategy().barrier()
