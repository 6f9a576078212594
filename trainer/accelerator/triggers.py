"""Gradient synchronisation forced back on for one backward pass (Accelerate's
``Accelerator.trigger_sync_in_backward``).

After forward passes under ``no_sync``, DDP has not prepared its reducer, so a later backward
outside ``no_sync`` would not all-reduce either. `trigger_sync_in_backward` prepares it and
turns synchronisation on for the block, as Accelerate does; for any other model it does nothing.
It knows torch's ``DistributedDataParallel`` by type because Accelerate's verb is a static
method of the model alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["trigger_sync_in_backward"]


@contextlib.contextmanager
def trigger_sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
    """Make the next backward pass of ``model`` synchronise gradients across processes.

    Args:
        model: the prepared model; only a ``DistributedDataParallel`` one is affected.
    """
    if not isinstance(model, DistributedDataParallel):
        yield
        return
    before = model.require_backward_grad_sync, model.require_forward_param_sync
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])  # what DDP's forward does outside no_sync
    try:
        yield
    finally:
        model.require_backward_grad_sync, model.require_forward_param_sync = before
