"""Helpers user code imports from ``lightning.pytorch.utilities``, with Lightning's behaviour.

``rank_zero_only`` and the ``rank_zero_info`` / ``rank_zero_warn`` / ``rank_zero_debug``
messages (run or shown on global rank 0 only), ``grad_norm`` (the gradient norms to log in
``on_before_optimizer_step``) and ``measure_flops`` (FLOPs of a forward, or forward and
backward, with torch's ``FlopCounterMode``). Nothing here starts or needs a process group: the
rank is torch.distributed's when a group is up, else the launcher's environment (``RANK``,
``LOCAL_RANK``, ``SLURM_PROCID``, ``JSM_NAMESPACE_RANK``), else 0. ``rank_zero_only.rank`` is
that rank as an int, Lightning's attribute: set here at import, and again by the strategies when
they start or join the process group (`trainer.strategies.DDPStrategy.setup_environment`).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = [
    "grad_norm",
    "launcher_rank",
    "measure_flops",
    "rank_zero_debug",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]

_log = logging.getLogger("trainer.utilities")
# rank_zero_info prints with no logging set up, as Lightning's (it sets its package logger so at
# import); a program that configured logging (a root handler) gets the records instead.
_log.setLevel(logging.INFO)
if not logging.getLogger().hasHandlers():
    _log.addHandler(logging.StreamHandler())
    _log.propagate = False
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
_T = TypeVar("_T")


def launcher_rank() -> int | None:
    """This process's global rank as its launcher set it (the first of ``RANK``,
    ``LOCAL_RANK``, ``SLURM_PROCID``, ``JSM_NAMESPACE_RANK`` that holds a number, Lightning's
    order), None when none does: how rank-zero helpers tell before any process group exists."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _global_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return launcher_rank() or 0


def rank_zero_only(function: Callable[..., _T], default: Any = None) -> Callable[..., _T | Any]:
    """Run ``function`` on global rank 0 only; other ranks get ``default`` (None).

    ``rank_zero_only.rank`` is this process's global rank, an int, as Lightning's attribute
    (``if rank_zero_only.rank == 0:``): at import the launcher's (``launcher_rank() or 0``);
    the strategies set it to the process group's rank when they start or join the group.
    While it holds its import-time value, the decorated functions read the rank afresh at each
    call (the process group's when one is up, else the launcher's environment), the same number
    in a launched job; any other value assigned to it is used as it is.

    Examples:
        >>> @rank_zero_only
        ... def report(text):
        ...     print(text)
        >>> report("once per job")
        once per job
    """

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        rank = rank_zero_only.rank  # type: ignore[attr-defined]
        if rank is None or rank == _IMPORT_RANK:  # not set since import: the process as it is now
            rank = _global_rank()
        if rank == 0:
            return function(*args, **kwargs)
        return default

    return wrapped


# Lightning's attribute, read at import as Lightning reads it (the strategies update it).
_IMPORT_RANK = launcher_rank() or 0
rank_zero_only.rank = _IMPORT_RANK  # type: ignore[attr-defined]


# Lightning's rank_zero_* call one more function (its `_info` / `_warn`) before logging or
# warnings: its ``stacklevel`` counts that frame, which this module does not have.
_FRAMES_LIGHTNING_HAS_MORE = 1


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.info`` on global rank 0 (the ``trainer.utilities`` logger); ``stacklevel``
    counts frames as Lightning's does (its default names the caller's line)."""
    _log.info(*args, stacklevel=stacklevel - _FRAMES_LIGHTNING_HAS_MORE, **kwargs)


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.debug`` on global rank 0 (the ``trainer.utilities`` logger)."""
    _log.debug(*args, stacklevel=stacklevel - _FRAMES_LIGHTNING_HAS_MORE, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn`` on global rank 0 (a ``UserWarning`` unless ``category=`` says); the
    warning names the caller's line, as Lightning's (``stacklevel`` counted as Lightning's)."""
    warnings.warn(message, stacklevel=stacklevel - _FRAMES_LIGHTNING_HAS_MORE, **kwargs)


def grad_norm(
    module: torch.nn.Module, norm_type: float | int | str, group_separator: str = "/"
) -> dict[str, torch.Tensor]:
    """The norm of each parameter's gradient and of all of them, to log before a step.

    Keys are ``grad_{norm_type}_norm{group_separator}{parameter name}`` and
    ``grad_{norm_type}_norm_total`` (``norm_type`` as a float: ``grad_2.0_norm/net.weight``);
    parameters without a gradient are left out, and with none the dict is empty.

    Raises:
        ValueError: ``norm_type`` is not a positive number (``"inf"`` is one).

    Examples:
        >>> def on_before_optimizer_step(self, optimizer):
        ...     self.log_dict(grad_norm(self.net, norm_type=2))
    """
    norm = float(norm_type)
    if norm <= 0:
        raise ValueError(
            f"grad_norm(norm_type={norm_type!r}): expected a positive number or 'inf'."
        )
    norms = {
        f"grad_{norm}_norm{group_separator}{name}": parameter.grad.detach().norm(norm)
        for name, parameter in module.named_parameters()
        if parameter.grad is not None
    }
    if norms:
        values = list(norms.values())
        together = torch.stack([value.float().to(values[0].device) for value in values])
        norms[f"grad_{norm}_norm_total"] = together.norm(norm)
    return norms


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The FLOPs of ``forward_fn()`` — and of the backward of ``loss_fn(output)`` when given —
    counted by ``torch.utils.flop_counter.FlopCounterMode``. Run it on the meta device
    (``torch.device("meta")``) to count without computing.

    Examples:
        >>> net = torch.nn.Linear(4, 2)
        >>> measure_flops(net, lambda: net(torch.ones(3, 4)))
        48
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return counter.get_total_flops()
