"""Optimizers whose ``step`` needs a closure (``torch.optim.LBFGS``) under automatic optimization.

Lightning runs every ``training_step`` inside ``optimizer.step(closure)``; the fit loop here runs
the step, the backward and the hooks first, then steps (STYLE: no optimizer closures). An
optimizer whose ``step(closure)`` has no default re-evaluates the loss several times per step,
so for it alone the loop passes a closure: its first call returns the loss already computed,
each later call runs ``training_step``, ``zero_grad``, backward and ``on_before_optimizer_step``
again on the same batch, as Lightning's closure does. Other optimizers never see a closure.

This module owns the detection and the handing over of the closure through the prepared
optimizer (whose ``step()`` takes none); the fit loop owns what the closure runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from trainer.errors import ConfigurationError

__all__ = ["check_closure_precision", "needs_closure", "stepping_with"]

_MISSING = object()


def needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer`` (prepared or raw) must be stepped as ``step(closure)``."""
    raw = getattr(optimizer, "optimizer", optimizer)
    try:
        parameter = inspect.signature(type(raw).step).parameters.get("closure")
    except (TypeError, ValueError):  # a builtin without a signature: it takes no closure
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def check_closure_precision(optimizer: Any, precision: Any) -> None:
    """Refuse a closure optimizer under a gradient scaler (16-mixed), as Lightning does.

    Raises:
        ConfigurationError: the precision plugin scales the loss.
    """
    if getattr(precision, "scaler", None) is not None:
        name = type(getattr(optimizer, "optimizer", optimizer)).__name__
        raise ConfigurationError(
            f"{name} steps with a closure that re-evaluates the loss, which a gradient scaler "
            f"(precision={precision.name!r}) cannot unscale between evaluations. Use "
            "precision='32-true' or 'bf16-mixed', or another optimizer."
        )


@contextmanager
def stepping_with(optimizer: Any, closure: Callable[[], torch.Tensor | None]) -> Iterator[None]:
    """Inside the block, the raw optimizer's ``step()`` is ``step(closure)``.

    The prepared optimizer's ``step()`` goes through the strategy and the precision plugin,
    which call the raw ``step()`` with no argument; the closure is bound on the raw instance
    for this one step and the previous binding (a scheduler's step counter) is put back.
    """
    raw = optimizer.optimizer
    previous = raw.__dict__.get("step", _MISSING)
    bound = raw.step
    raw.step = lambda *args, **kwargs: bound(closure)
    try:
        yield
    finally:
        if previous is _MISSING:
            del raw.step
        else:
            raw.step = previous
