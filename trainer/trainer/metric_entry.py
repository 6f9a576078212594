"""One name logged with ``self.log``: its options, checked, and the entry that keeps its values.

`LogOptions` are one call's options with the hook's defaults resolved (what must agree within a
hook); a `MetricEntry` holds the name's step value, its epoch accumulator and the names it is
published under (Lightning's ``name_step`` / ``name_epoch`` and ``/dataloader_idx_N``). The store
that owns the entries and reads them out is `trainer.trainer.metrics.MetricStore`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import torch

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError, describe

__all__ = [
    "HookKey",
    "LogOptions",
    "MetricEntry",
    "batch_size_of",
    "describe_conflict",
    "is_torchmetric",
    "resolve_reduce_fx",
]

_REDUCE_FX = ("mean", "sum", "max", "min")
_REDUCE_ALIASES: dict[Any, str] = {
    torch.mean: "mean",
    torch.sum: "sum",
    torch.max: "max",
    torch.min: "min",
    max: "max",
    min: "min",
    sum: "sum",
}


def is_torchmetric(value: Any) -> bool:
    """Whether ``value`` is a torchmetrics ``Metric`` (computed, synced and reset at epoch end)."""
    tm = sys.modules.get("torchmetrics")  # never import torchmetrics just to check
    return tm is not None and isinstance(value, tm.Metric)


class LogOptions(NamedTuple):
    """The options of one ``self.log`` call, defaults resolved (what must agree within a hook)."""

    on_step: bool
    on_epoch: bool
    reduce_fx: str
    prog_bar: bool
    logger: bool
    sync_dist: bool


# (hook name, default on_step, default on_epoch, whether a value per step is allowed): what a
# MetricStore is logging from (`trainer.trainer.hooks.LOG_KEYS`).
HookKey = tuple[str, bool, bool, bool]


class MetricEntry:
    """One logged name: its options and its step value / epoch accumulator."""

    __slots__ = (
        "batch_weighted",
        "dataloader_idx",
        "epoch_key",
        "is_metric",
        "last_call",
        "logger",
        "metric",
        "on_epoch",
        "on_step",
        "options",
        "plain_key",
        "prog_bar",
        "reduce_fx",
        "step_key",
        "step_value",
        "sync_dist",
        "total",
        "weight",
    )

    def __init__(
        self, options: LogOptions, name: str, suffix: str, dataloader_idx: int | None
    ) -> None:
        self.on_step = options.on_step
        self.on_epoch = options.on_epoch
        self.prog_bar = options.prog_bar
        self.logger = options.logger
        self.reduce_fx = options.reduce_fx
        self.sync_dist = options.sync_dist
        self.step_value: Any = None
        self.total: Any = None
        self.weight: Any = 0
        self.metric: Any = None
        self.is_metric = False
        self.options = options  # the first call's: later calls in the hook must agree
        self.last_call: tuple[Any, ...] = ()  # options as given, + hook: equal means checked
        self.dataloader_idx = dataloader_idx
        # The published names (Lightning's: the dataloader suffix goes after _step / _epoch).
        self.plain_key = f"{name}{suffix}"
        self.step_key = f"{name}_step{suffix}" if options.on_epoch else self.plain_key
        self.epoch_key = f"{name}_epoch{suffix}" if options.on_step else self.plain_key


def resolve_reduce_fx(name: str, reduce_fx: Any, hook: str) -> str:
    """``reduce_fx`` as one of `_REDUCE_FX` (``torch.mean`` -> "mean")."""
    try:
        fx = _REDUCE_ALIASES.get(reduce_fx, reduce_fx)
    except TypeError:  # unhashable
        fx = reduce_fx
    if not isinstance(fx, str) or fx not in _REDUCE_FX:
        raise ConfigurationError(
            f"self.log({name!r}, reduce_fx={describe(reduce_fx)}) in {hook}: "
            f"expected one of {_REDUCE_FX} (or torch.mean/sum/max/min)."
        )
    return fx


def describe_conflict(name: str, hook: str, first: LogOptions, again: LogOptions) -> str:
    """The error message for a name logged twice in one hook with different options."""
    changed = ", ".join(
        f"{field}={before!r} then {field}={after!r}"
        for field, before, after in zip(LogOptions._fields, first, again, strict=True)
        if before != after
    )
    return (
        f"self.log({name!r}, ...) was called twice in {hook} with different options: {changed}. "
        f"Within one hook a name keeps one set of options (as in Lightning): pass the same "
        f"options to every self.log({name!r}, ...) in {hook}, or log the other value under "
        "another name."
    )


def batch_size_of(batch: Any) -> int | None:
    """The batch size an epoch mean weights a value with, found as Lightning finds it.

    The first tensor's first dimension (a 0-d tensor counts 1), searching tensors, mappings,
    dataclasses and other iterables depth first; strings and other leaves have no size. None when
    the batch holds no tensor. A second size that differs (another tensor's, or a leaf met
    after the first tensor) makes the choice ambiguous: warned once, the first size is kept.
    """
    found = None
    for size in _sizes(batch):
        if found is None:
            found = size
        elif size != found:
            message = (
                "Trying to infer the batch_size from an ambiguous collection. The batch size "
                f"found is {found}. To avoid any miscalculation, pass it: "
                "self.log(..., batch_size=batch_size)."
            )
            if message not in _WARNED:
                _WARNED.add(message)
                warn_user(message)
            break
    return found


_WARNED: set[str] = set()


def _sizes(batch: Any) -> Iterator[int | None]:
    if isinstance(batch, torch.Tensor):
        yield int(batch.shape[0]) if batch.ndim else 1
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _sizes(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, field.name))
    elif isinstance(batch, Iterable) and not isinstance(batch, (str, bytes, *_numpy_leaves())):
        for item in batch:
            yield from _sizes(item)
    else:
        yield None


def _numpy_leaves() -> tuple[type, ...]:
    """numpy arrays are leaves (walking one element by element would take ages)."""
    numpy = sys.modules.get("numpy")
    return (numpy.ndarray, numpy.generic) if numpy is not None else ()
