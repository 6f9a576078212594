"""DDP's reducer under the Trainer: manual optimization, and parameters a step leaves unused.

DDP prepares its reducer for a backward pass when its forward returns. The Trainer runs
``training_step`` inside the DDP forward (so DDP sees the step), but under manual optimization the
step calls ``manual_backward`` itself, before that forward returns: the reducer, not yet prepared,
would let the gradients stay local to each process (the processes' weights drift apart), and,
prepared afterwards for a backward that never comes, refuse the next step ("`initialize_buckets`
must NOT be called during autograd execution"). Lightning does the same as here: the forward
leaves the reducer alone, and each ``manual_backward`` prepares it for its own loss.

A step whose backward reaches only some parameters leaves DDP waiting for the others' gradients;
torch then fails the next step with a message about its own constructor. `unused_parameters_error`
turns that into a `StrategyError` naming the Trainer's setting, as Lightning rewrites it.

For a model that is not a ``DistributedDataParallel`` the context managers do nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from trainer.errors import StrategyError

__all__ = ["manual_backward", "manual_step_forward", "unused_parameters_error"]

# Static-graph models whose first iteration's reduction was queued (once per model).
_static_graph_ready: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()


@contextlib.contextmanager
def manual_step_forward(model: torch.nn.Module) -> Iterator[None]:
    """The forward that runs a manual ``training_step``: DDP's forward does not prepare its
    reducer when it returns (each `manual_backward` does)."""
    if not isinstance(model, DistributedDataParallel):
        yield
        return
    model.require_backward_grad_sync = False
    try:
        yield
    finally:
        model.require_backward_grad_sync = True


@contextlib.contextmanager
def manual_backward(model: torch.nn.Module, loss: torch.Tensor) -> Iterator[None]:
    """Around one ``manual_backward(loss)``: the reducer prepared for ``loss``'s graph, so the
    backward all-reduces the gradients, and buffers synced before the next forward."""
    if not isinstance(model, DistributedDataParallel) or not torch.is_grad_enabled():
        yield
        return
    before = model.require_backward_grad_sync
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True  # DDP's own setting after a synced forward
    reducer: Any = model.reducer
    reducer._rebuild_buckets()  # noqa: SLF001 (once, after the first backward; else a no-op)
    is_searching = model.find_unused_parameters and not model.static_graph
    reducer.prepare_for_backward(list(_find_tensors(loss)) if is_searching else [])
    try:
        yield
        if model.static_graph and model not in _static_graph_ready:
            # A static graph's first iteration reduces once the graph is known; DDP's forward
            # would have queued that at the end of its backward pass.
            reducer._delay_all_reduce()  # noqa: SLF001
            _static_graph_ready.add(model)
    finally:
        model.require_backward_grad_sync = before


def unused_parameters_error(error: BaseException) -> StrategyError | None:
    """The Trainer's message for torch's "parameters that were not used in producing loss"
    error of a DDP step (None for any other error)."""
    if not isinstance(error, RuntimeError) or "Expected to have finished reduction" not in str(
        error
    ):
        return None
    return StrategyError(
        "DDP: a training step's backward did not reach every parameter (some took no part in "
        "the loss, or were frozen after the model was wrapped), so DDP still waited for their "
        "gradients when the next step began. Pass strategy='ddp_find_unused_parameters_true' "
        "(DDPStrategy(find_unused_parameters=True)), as in Lightning, or make every step use "
        "all trainable parameters. torch's error: " + str(error).split("\n")[0]
    )
