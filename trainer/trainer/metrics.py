"""Where ``self.log`` values go: kept on the device, read only when a logger or the bar needs them.

One `MetricStore` per stage (fit's training, validation, test). A step value replaces the
previous one; an epoch value accumulates with its reduction (batch-size-weighted mean by default)
as tensor arithmetic, so logging never forces a host-device sync per step. torchmetrics ``Metric``
values are computed, synced and reset at epoch end.

What the Trainer publishes follows Lightning 2.6: a value stays in ``callback_metrics``,
``logged_metrics`` and ``progress_bar_metrics`` until the same name replaces it (an epoch's values
are kept when the next epoch starts; `reset` forgets them at the start of a run). A name logged
with both ``on_step`` and ``on_epoch`` is published as ``name_step`` and ``name_epoch``, and
``name`` holds the latest of the two. Validation and test step values go to the loggers and the
progress bar only: their ``callback_metrics`` are the epoch values.

Within one hook a name keeps the options it was first logged with (``on_step``, ``on_epoch``,
``reduce_fx``, ``prog_bar``, ``logger``, ``sync_dist``): logging it again with other options is a
`ConfigurationError`, as Lightning's ``MisconfigurationException``. A call is checked when it
differs from the name's previous call; repeating it costs one tuple comparison.

With several evaluation dataloaders the loop sets `MetricStore.dataloader_idx`: each name logged
then is its own entry, published as ``name/dataloader_idx_N`` (``name_epoch/dataloader_idx_N``
when forked), and `MetricStore.epoch_items` can pick one dataloader's values, as Lightning's
``validate()`` returns one dict per dataloader.
"""

from __future__ import annotations

import itertools
import numbers
import operator
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError, describe
from trainer.trainer.hooks import LOG_KEYS
from trainer.trainer.metric_entry import (
    HookKey,
    LogOptions,
    MetricEntry,
    batch_size_of,
    describe_conflict,
    is_torchmetric,
    resolve_reduce_fx,
)

if TYPE_CHECKING:
    from trainer.strategies import Strategy

# (time, {published name: value}): a group of values and when it was last brought up to date.
Layer = tuple[int, dict[str, Any]]

__all__ = ["MetricStore", "logging_dtype", "merge_layers", "stage_stores", "to_float"]


class MetricStore:
    """The values logged during one stage.

    Args:
        reducer: ``(tensor, op) -> tensor`` across processes, for ``sync_dist=True``.
    """

    def __init__(
        self,
        reducer: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
        clock: Iterator[int] | None = None,
    ) -> None:
        # by (hook, name): as in Lightning, each hook keeps its own values of a name
        self.entries: dict[tuple[str, str], MetricEntry] = {}
        self.hook: HookKey = LOG_KEYS["training_step"]
        self.current_batch: Any = None
        self._batch_size_cache: tuple[int, int | None] | None = None  # (id(batch), size)
        self.epoch_values: dict[str, Any] = {}
        # The step and epoch values of earlier epochs of this run, by name (see the module doc).
        self.kept_steps: dict[str, Any] = {}
        self.kept_epochs: dict[str, Any] = {}
        # Validation/test batches seen per dataloader since `reset`: the step of their step rows.
        self.batch_counts: dict[int, int] = {}
        self.dataloader_idx: int | None = None  # set by the loop when there are several loaders
        self.reducer = reducer
        # When each group of values was last brought up to date, on a clock the stages of one
        # Trainer share: a name two stages log reads as the later one's (`merge_layers`).
        self.clock = itertools.count(1) if clock is None else clock
        self.step_time = self.epoch_time = self.kept_step_time = self.kept_epoch_time = 0
        self.key_check: Callable[[list[str]], None] | None = None

    @property
    def hook_name(self) -> str:
        """The hook logging now (set by the loops and `HookTable` with its `LOG_KEYS` entry)."""
        return self.hook[0]

    # ---- writing ------------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None,
        on_epoch: bool | None,
        prog_bar: bool,
        logger: bool,
        reduce_fx: str | Callable[..., Any],
        sync_dist: bool,
        batch_size: int | None,
        add_dataloader_idx: bool = True,
    ) -> None:
        key = name
        if self.dataloader_idx is not None:  # several eval dataloaders: one entry per loader
            if add_dataloader_idx:
                key = f"{name}/dataloader_idx_{self.dataloader_idx}"
            else:
                self._check_unsuffixed(name)
        hook = self.hook
        entry = self.entries.get((hook[0], key))
        call = (on_step, on_epoch, reduce_fx, prog_bar, logger, sync_dist, hook)
        if entry is None or call != entry.last_call:  # the hot path compares identical objects
            entry = self._check_call(key, name, call, value, add_dataloader_idx)
        if entry.is_metric:
            if entry.metric is not None and entry.metric is not value:
                raise ConfigurationError(
                    f"self.log({name!r}, ...) in {self.hook_name}: two different Metric objects "
                    "were logged under this name in one epoch (Lightning refuses it too); one "
                    "would silently replace the other. Log each Metric under its own name."
                )
            entry.metric = value
            if entry.on_step:
                entry.step_value = getattr(value, "_forward_cache", None)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ConfigurationError(
                    f"self.log({name!r}, ...) in {self.hook_name}: expected a scalar, received a "
                    f"tensor of shape {tuple(value.shape)}. Log value.mean() or one element."
                )
            value = value.detach()
            if value.dtype is not torch.float32 and value.dtype is not torch.float64:
                value = value.to(logging_dtype())  # a bf16 mean over an epoch would drift
        elif not isinstance(value, numbers.Real):  # bool and numpy numbers too, as Lightning
            raise ConfigurationError(
                f"self.log({name!r}, value) in {self.hook_name}: expected a number, a scalar "
                f"Tensor or a torchmetrics Metric, received {describe(value)}."
            )
        else:
            value = torch.tensor(float(value), dtype=logging_dtype())
        if entry.on_step:
            # Lightning reduces a step value over the processes at once with sync_dist (a
            # collective per call); the epoch accumulates the local values, synced at its end.
            is_synced = entry.sync_dist and self.reducer is not None
            entry.step_value = self.reducer(value, entry.reduce_fx) if is_synced else value
        if entry.on_epoch:
            self._accumulate(entry, value, batch_size)

    def _check_unsuffixed(self, name: str) -> None:
        """``add_dataloader_idx=False`` from two dataloaders would mix them under one name."""
        entry = self.entries.get((self.hook[0], name))
        if entry is not None and entry.dataloader_idx != self.dataloader_idx:
            raise ConfigurationError(
                f"self.log({name!r}, add_dataloader_idx=False) in {self.hook_name}: logged from "
                f"dataloader {entry.dataloader_idx} and {self.dataloader_idx}, which would mix "
                "their values under one name (Lightning refuses it too). Log a name per "
                "dataloader, or leave add_dataloader_idx=True."
            )

    def _check_call(
        self, key: str, name: str, call: tuple[Any, ...], value: Any, add_dataloader_idx: bool
    ) -> MetricEntry:
        """The entry for ``name``, its options as given in ``call`` resolved and checked against
        the first call with this name in the same hook (Lightning's rule)."""
        on_step, on_epoch, reduce_fx, prog_bar, logger, sync_dist, hook = call
        hook_name, default_on_step, default_on_epoch, per_step = hook
        if add_dataloader_idx and "/dataloader_idx_" in name:  # Lightning refuses it too
            raise ConfigurationError(
                f"self.log({name!r}) in {hook_name}: the name holds '/dataloader_idx_', which "
                "the trainer adds itself for several dataloaders. Log it without the suffix, or "
                "pass add_dataloader_idx=False."
            )
        options = LogOptions(
            default_on_step if on_step is None else on_step,
            default_on_epoch if on_epoch is None else on_epoch,
            resolve_reduce_fx(name, reduce_fx, hook_name),
            prog_bar,
            logger,
            sync_dist,
        )
        if not options.on_step and not options.on_epoch:
            raise ConfigurationError(
                f"self.log({name!r}) in {hook_name}: on_step=False and on_epoch=False "
                "would record nothing. Set one of them to True."
            )
        if not per_step and (options.on_step or not options.on_epoch):
            raise ConfigurationError(
                f"self.log({name!r}, on_step={options.on_step}, on_epoch={options.on_epoch}) in "
                f"{hook_name}: this hook logs once per epoch, so only on_step=False, "
                "on_epoch=True is allowed (as in Lightning). Log per-step values in "
                "training_step or a *_batch_end hook."
            )
        entry = self.entries.get((hook_name, key))
        if entry is None:
            idx = self.dataloader_idx
            suffix = f"/dataloader_idx_{idx}" if idx is not None and add_dataloader_idx else ""
            entry = MetricEntry(options, name, suffix, idx)
            entry.is_metric = is_torchmetric(value)
            self.entries[(hook_name, key)] = entry
        elif entry.options != options:
            raise ConfigurationError(describe_conflict(name, hook_name, entry.options, options))
        entry.last_call = call
        return entry

    def _accumulate(self, entry: MetricEntry, value: torch.Tensor, batch_size: int | None) -> None:
        if (
            entry.total is None
            and value.dtype is torch.float32
            and logging_dtype() is torch.float64
        ):
            value = value.double()  # Lightning's sum starts in the logging dtype: the wider wins
        fx = entry.reduce_fx
        if fx == "mean":
            weight = batch_size if batch_size is not None else self._infer_batch_size(entry)
            contribution = value * weight
            entry.total = contribution if entry.total is None else entry.total + contribution
            entry.weight += weight
        elif fx == "sum":
            entry.total = value if entry.total is None else entry.total + value
        elif entry.total is None:
            entry.total = value
        else:
            pick = torch.maximum if fx == "max" else torch.minimum
            entry.total = pick(entry.total, value)

    def _infer_batch_size(self, entry: MetricEntry) -> int:
        """The weight of a value in its epoch mean: the batch's size (Lightning's search);
        1 in the hooks that run once per epoch, where no batch is in progress."""
        if not self.hook[3]:
            return 1
        batch = self.current_batch
        cached = self._batch_size_cache
        if cached is not None and cached[0] == id(batch):
            size = cached[1]
        else:
            size = batch_size_of(batch)
            self._batch_size_cache = (id(batch), size)
        if size is None:
            raise ConfigurationError(
                f"self.log({entry.plain_key!r}) in {self.hook_name}: the epoch value is a mean "
                "weighted by batch size, and the batch holds no tensor to take it from "
                f"(a {type(batch).__name__}). Pass it: self.log(..., batch_size=N), as in "
                "Lightning."
            )
        return size

    # ---- reading ------------------------------------------------------------------------
    def step_items(self, *, for_logger: bool = False, for_bar: bool = False) -> dict[str, Any]:
        """Latest step values by their published name (``name_step`` when also on_epoch)."""
        items: dict[str, Any] = {}
        current = self.dataloader_idx  # the dataloader running now: its values only
        for entry in self.entries.values():
            if not entry.on_step or entry.step_value is None or entry.dataloader_idx != current:
                continue
            if (for_logger and not entry.logger) or (for_bar and not entry.prog_bar):
                continue
            items[entry.step_key] = entry.step_value
        return items

    def finalize_epoch(self) -> dict[str, Any]:
        """Compute every epoch value (one sync here, not per step) and remember it."""
        synced = sorted(  # by name (and dataloader suffix): the same on every rank
            key for (_, key), entry in self.entries.items() if entry.sync_dist and entry.on_epoch
        )
        if self.key_check is not None:  # on every rank, also one with no synced names:
            self.key_check(synced)  # one that skipped it would leave the others waiting
        for name, entry in self.entries.items():
            if not entry.on_epoch:
                continue
            value = self._epoch_value(entry)
            if value is None:
                continue
            self.epoch_values[name] = (value, entry)
        return {name: value for name, (value, _) in self.epoch_values.items()}

    def _epoch_value(self, entry: MetricEntry) -> Any:
        if entry.is_metric:
            if entry.metric is None or not getattr(entry.metric, "update_count", 1):
                return None
            value = entry.metric.compute()  # torchmetrics syncs across processes itself
            entry.metric.reset()
            entry.metric = None
            return value.detach() if isinstance(value, torch.Tensor) else value
        if entry.total is None:
            return None
        total = entry.total
        if entry.sync_dist and self.reducer is not None:
            op = {"mean": "sum", "sum": "sum", "max": "max", "min": "min"}[entry.reduce_fx]
            total = self.reducer(total, op)
            weight = self.reducer(torch.as_tensor(float(entry.weight), device=total.device), "sum")
        else:
            weight = entry.weight
        value = total / weight if entry.reduce_fx == "mean" else total
        entry.total, entry.weight = None, 0
        return value

    def epoch_items(
        self, *, for_logger: bool = False, for_bar: bool = False, dataloader_idx: int | None = None
    ) -> dict[str, Any]:
        """Computed epoch values by published name (``name_epoch`` when also on_step).

        Args:
            dataloader_idx: only the values of that dataloader and those logged outside any
                (in the epoch hooks), as Lightning's result for one dataloader.
        """
        items = {}
        for value, entry in self.epoch_values.values():
            if (for_logger and not entry.logger) or (for_bar and not entry.prog_bar):
                continue
            if dataloader_idx is not None and entry.dataloader_idx not in (None, dataloader_idx):
                continue
            items[entry.epoch_key] = value
        return items

    def callback_items(self, *, is_training: bool = True) -> list[Layer]:
        """What callbacks see: by published name and by plain name, the latest value of each.

        Args:
            is_training: the training store; the others (validation, test) give epoch values
                only, as Lightning's ``callback_metrics`` never holds their ``_step`` values.
        """
        layers = []
        for time, is_step, values in self._layers():
            if is_step and not is_training:
                continue
            items: dict[str, Any] = {}
            for entry, forked, value in values:
                items[entry.plain_key] = value
                items[forked] = value
            layers.append((time, items))
        return layers

    def logged_items(self) -> list[Layer]:
        """Lightning's ``logged_metrics``: the latest value of every ``logger=True`` name."""
        return [
            (time, {forked: value for entry, forked, value in values if entry.logger})
            for time, _, values in self._layers()
        ]

    def bar_items(self) -> list[Layer]:
        """Lightning's ``progress_bar_metrics``: the latest value of every ``prog_bar=True`` name."""
        return [
            (time, {forked: value for entry, forked, value in values if entry.prog_bar})
            for time, _, values in self._layers()
        ]

    def _layers(self) -> list[tuple[int, bool, list[tuple[MetricEntry, str, Any]]]]:
        """``(time, is_step, [(entry, published name, value)])``: the values of earlier epochs,
        then this epoch's, step values and epoch values apart, each with the time it was last
        brought up to date (`touch_steps`, `touch_epochs`)."""
        live_steps = {
            name: entry.step_value
            for name, entry in self.entries.items()
            if entry.on_step and entry.step_value is not None
        }
        live_epochs = {name: value for name, (value, _) in self.epoch_values.items()}
        layers = []
        for time, values, is_step in (
            (self.kept_step_time, self.kept_steps, True),
            (self.kept_epoch_time, self.kept_epochs, False),
            (self.step_time, live_steps, True),
            (self.epoch_time, live_epochs, False),
        ):
            published = []
            for name, value in values.items():
                entry = self.entries[name]
                published.append((entry, entry.step_key if is_step else entry.epoch_key, value))
            layers.append((time, is_step, published))
        return layers

    def touch_steps(self) -> None:
        """A batch of this stage runs: its step values are the latest (Lightning's dicts take
        the running stage's values at every batch)."""
        self.step_time = next(self.clock)

    def touch_epochs(self) -> None:
        """This stage's epoch ends: its epoch values are the latest."""
        self.epoch_time = next(self.clock)

    def reset(self) -> None:
        """Forget everything (start of a stage run)."""
        self.entries.clear()
        self.epoch_values.clear()
        self.kept_steps.clear()
        self.kept_epochs.clear()
        self.batch_counts.clear()
        self.dataloader_idx = None

    def start_epoch(self) -> None:
        """Keep the last epoch's values for reading; clear accumulators; keep options."""
        for name, (value, _) in self.epoch_values.items():
            self.kept_epochs[name] = value
        self.epoch_values.clear()
        self.kept_step_time, self.kept_epoch_time = self.step_time, self.epoch_time
        for name, entry in self.entries.items():
            if entry.step_value is not None:
                self.kept_steps[name] = entry.step_value
            entry.total, entry.weight, entry.step_value, entry.metric = None, 0, None, None


def merge_layers(layers: list[Layer]) -> dict[str, Any]:
    """One dict of the stores' layers, later times winning a name (ties keep their order)."""
    merged: dict[str, Any] = {}
    for _, items in sorted(layers, key=operator.itemgetter(0)):
        merged.update(items)
    return merged


def logging_dtype() -> torch.dtype:
    """The dtype logged values are kept in, as in Lightning: float64 while torch's default dtype
    is float64 (inside the steps of a ``"64-true"`` run), float32 otherwise. Half-precision and
    integer values are converted to it, and epoch values accumulate in it (or in float64 when a
    value is float64)."""
    return torch.float64 if torch.get_default_dtype() is torch.float64 else torch.float32


def to_float(value: Any) -> float:
    """A logged value as a Python float (the one place tensors are read)."""
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def stage_stores(strategy: Strategy) -> dict[str, MetricStore]:
    """The ``self.log`` stores of the "train", "validation" and "test" stages.

    ``sync_dist=True`` values are reduced over ``strategy``'s processes, after a check that every
    process logged the same names (a clear error instead of a hang in the collective). With
    several processes every epoch end checks, whether or not this process logged synced names:
    one gather of the names per `MetricStore.finalize_epoch`, all ranks taking part.
    """

    def reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
        return strategy.all_reduce(tensor, op=op)

    def check_same_keys(names: list[str]) -> None:
        if strategy.world_size == 1:
            return
        everyone = strategy.all_gather_object(names)
        if any(other != names for other in everyone):
            detail = "; ".join(f"rank {rank}: {keys}" for rank, keys in enumerate(everyone))
            raise ConfigurationError(
                f"self.log(..., sync_dist=True): the processes logged different metric names ({detail}). "
                "Log the same names on every rank (log a default value where a rank has none)."
            )

    clock = itertools.count(1)
    stores = {stage: MetricStore(reduce, clock) for stage in ("train", "validation", "test")}
    for store in stores.values():
        store.key_check = check_same_keys
    return stores
