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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError, describe
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

__all__ = ["MetricStore", "logging_dtype", "stage_stores", "to_float"]


class MetricStore:
    """The values logged during one stage.

    Args:
        reducer: ``(tensor, op) -> tensor`` across processes, for ``sync_dist=True``.
    """

    def __init__(self, reducer: Callable[[torch.Tensor, str], torch.Tensor] | None = None) -> None:
        self.entries: dict[str, MetricEntry] = {}
        self.hook: HookKey = ("training_step", True, False)
        self.current_batch: Any = None
        self._batch_size_cache: tuple[int, int] | None = None  # (id(batch), size)
        self.epoch_values: dict[str, Any] = {}
        # The step and epoch values of earlier epochs of this run, by name (see the module doc).
        self.kept_steps: dict[str, Any] = {}
        self.kept_epochs: dict[str, Any] = {}
        # Validation/test batches seen per dataloader since `reset`: the step of their step rows.
        self.batch_counts: dict[int, int] = {}
        self.dataloader_idx: int | None = None  # set by the loop when there are several loaders
        self.reducer = reducer
        self.key_check: Callable[[list[str]], None] | None = None

    # The Trainer sets these three before the hooks it runs; they are kept as one tuple, `hook`,
    # so that a log call compares one object to tell that nothing changed since its last check.
    @property
    def hook_name(self) -> str:
        return self.hook[0]

    @hook_name.setter
    def hook_name(self, name: str) -> None:
        self.hook = (name, self.hook[1], self.hook[2])

    @property
    def default_on_step(self) -> bool:
        return self.hook[1]

    @default_on_step.setter
    def default_on_step(self, on_step: bool) -> None:
        self.hook = (self.hook[0], on_step, self.hook[2])

    @property
    def default_on_epoch(self) -> bool:
        return self.hook[2]

    @default_on_epoch.setter
    def default_on_epoch(self, on_epoch: bool) -> None:
        self.hook = (self.hook[0], self.hook[1], on_epoch)

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
        entry = self.entries.get(key)
        call = (on_step, on_epoch, reduce_fx, prog_bar, logger, sync_dist, self.hook)
        if entry is None or call != entry.last_call:  # the hot path compares identical objects
            entry = self._check_call(key, name, call, value, add_dataloader_idx)
        if entry.is_metric:
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
        elif not isinstance(value, int | float) or isinstance(value, bool):
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
        entry = self.entries.get(name)
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
        hook_name, default_on_step, default_on_epoch = hook
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
        entry = self.entries.get(key)
        if entry is None:
            idx = self.dataloader_idx
            suffix = f"/dataloader_idx_{idx}" if idx is not None and add_dataloader_idx else ""
            entry = MetricEntry(options, name, suffix, idx)
            entry.is_metric = is_torchmetric(value)
            self.entries[key] = entry
        first = entry.options_by_hook.setdefault(hook, options)
        if first != options:
            raise ConfigurationError(describe_conflict(name, hook_name, first, options))
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
            weight = batch_size if batch_size is not None else self._infer_batch_size()
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

    def _infer_batch_size(self) -> int:
        batch = self.current_batch
        cached = self._batch_size_cache
        if cached is not None and cached[0] == id(batch):
            return cached[1]
        size = batch_size_of(batch)
        self._batch_size_cache = (id(batch), size)
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
        synced = sorted(
            name for name, entry in self.entries.items() if entry.sync_dist and entry.on_epoch
        )
        if self.key_check is not None and synced:
            self.key_check(synced)  # ranks that logged different names would hang in the sync
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

    def callback_items(self, *, is_training: bool = True) -> dict[str, Any]:
        """What callbacks see: by published name and by plain name, the latest value of each.

        Args:
            is_training: the training store; the others (validation, test) give epoch values
                only, as Lightning's ``callback_metrics`` never holds their ``_step`` values.
        """
        items: dict[str, Any] = {}
        for entry, forked, value, is_step in self._published():
            if is_step and not is_training:
                continue
            items[entry.plain_key] = value
            items[forked] = value
        return items

    def logged_items(self) -> dict[str, Any]:
        """Lightning's ``logged_metrics``: the latest value of every ``logger=True`` name."""
        return {forked: value for entry, forked, value, _ in self._published() if entry.logger}

    def bar_items(self) -> dict[str, Any]:
        """Lightning's ``progress_bar_metrics``: the latest value of every ``prog_bar=True`` name."""
        return {forked: value for entry, forked, value, _ in self._published() if entry.prog_bar}

    def _published(self) -> list[tuple[MetricEntry, str, Any, bool]]:
        """``(entry, published name, value, is_step)``, oldest first: kept values, then this
        epoch's step values, then its epoch values (so the plain name ends on the latest)."""
        live_steps = {
            name: entry.step_value
            for name, entry in self.entries.items()
            if entry.on_step and entry.step_value is not None
        }
        live_epochs = {name: value for name, (value, _) in self.epoch_values.items()}
        published = []
        for values, is_step in (
            (self.kept_steps, True),
            (self.kept_epochs, False),
            (live_steps, True),
            (live_epochs, False),
        ):
            for name, value in values.items():
                entry = self.entries[name]
                published.append(
                    (entry, entry.step_key if is_step else entry.epoch_key, value, is_step)
                )
        return published

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
        for name, entry in self.entries.items():
            if entry.step_value is not None:
                self.kept_steps[name] = entry.step_value
            entry.total, entry.weight, entry.step_value = None, 0, None


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
    process logged the same names (a clear error instead of a hang in the collective).
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

    stores = {stage: MetricStore(reduce) for stage in ("train", "validation", "test")}
    for store in stores.values():
        store.key_check = check_same_keys
    return stores
