"""ThroughputMonitor: batches, samples, items (tokens), FLOPs per second and MFU, per stage.

This module owns, for each stage (train, validate, test, predict), the totals and the sliding
window of the last updates (`StageThroughput`), the metrics computed from them under Lightning's
names (``train/device/samples_per_sec``, ...), when they are written to ``trainer.loggers``,
and the table of known device peak FLOPs (`get_available_flops`). It counts what the user's
``batch_size_fn`` and ``length_fn`` say; it does not measure FLOPs (``flops_per_batch``, or the
module's ``flops_per_batch`` attribute, as in Lightning).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.logger_rows import is_log_due, send_to_loggers

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["StageThroughput", "ThroughputMonitor", "get_available_flops"]

# Dense peak FLOP/s per device from the vendors' data sheets (no sparsity). "tf32" is float32
# matmuls on tensor cores (torch.backends.cuda.matmul.allow_tf32 / "high" matmul precision).
_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "h100 sxm": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "h100 nvl": {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60.0e12},
    "h100 pcie": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378.0e12, "fp32": 51.2e12},
    "a100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}
_DTYPE_OF_PRECISION = {
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "16-mixed": "fp16",
    "16-true": "fp16",
    "32-true": "fp32",
}


def get_available_flops(device_name: str, precision: str = "32-true") -> float | None:
    """The dense peak FLOP/s of a known GPU for a precision mode, or None when unknown.

    Args:
        device_name: as ``torch.cuda.get_device_name()`` reports it, e.g. "NVIDIA H100 80GB HBM3".
        precision: the Trainer's precision name ("bf16-mixed", "32-true", ...). "32-true" counts
            TF32 tensor-core peaks when ``torch.get_float32_matmul_precision()`` is not "highest".

    Returns:
        FLOP/s, or None for an unknown device or precision (e.g. a CPU, "64-true", "fp8").

    Examples:
        >>> get_available_flops("NVIDIA H100 80GB HBM3", "bf16-mixed")
        989400000000000.0
        >>> get_available_flops("NVIDIA A100-SXM4-80GB", "32-true")  # "highest" precision
        19500000000000.0
    """
    name = device_name.lower()
    if "h200" in name:
        chip = "h200"
    elif "h100" in name:
        chip = "h100 nvl" if "nvl" in name else "h100 pcie" if "pcie" in name else "h100 sxm"
    elif "a100" in name:
        chip = "a100"
    else:
        return None
    dtype = _DTYPE_OF_PRECISION.get(precision)
    if dtype == "fp32" and torch.get_float32_matmul_precision() != "highest":
        dtype = "tf32"
    return _PEAK_FLOPS[chip].get(dtype) if dtype is not None else None


@dataclass
class StageThroughput:
    """One stage's counts and its window of the last ``window_size`` updates (Lightning's
    ``Throughput``): what `compute` turns into metrics.

    Args:
        window_size: updates in the window; rates appear once it is full.
        world_size: processes; with more than one, global rates (device rate x world size).
        available_flops: one device's peak FLOP/s, for ``device/mfu``; None: no MFU.
        separator: between ``device`` and a rate's name.
    """

    window_size: int
    world_size: int = 1
    available_flops: float | None = None
    separator: str = "/"
    t0: float = 0.0  # the stage's start; moved later by the validations inside fit
    batches: int = 0
    samples: int = 0
    lengths: int = 0
    # (seconds since t0, batches, samples, lengths) after each of the last window_size updates
    window: deque[tuple[float, int, int, int]] = field(init=False)
    flops: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self.window = deque(maxlen=self.window_size)
        self.flops = deque(maxlen=self.window_size)

    def update(self, now: float, samples: int, lengths: int | None, flops: float | None) -> None:
        """Count one batch of ``samples`` (``lengths`` items; ``flops`` on this device)."""
        self.batches += 1
        self.samples += samples
        if lengths is not None:
            self.lengths += lengths
        self.window.append((now - self.t0, self.batches, self.samples, self.lengths))
        if flops is not None:
            self.flops.append(flops * self.world_size)

    def compute(self, has_lengths: bool) -> dict[str, float]:
        """Totals (``time``, ``batches``, ``samples``, ``lengths``), and the window's rates per
        device (``device/...``) and, on several processes, over all of them."""
        if not self.window:
            return {}
        (t0, b0, s0, l0), (t1, b1, s1, l1) = self.window[0], self.window[-1]
        metrics = {"time": t1, "batches": self.batches, "samples": self.samples}
        if has_lengths:
            metrics["lengths"] = self.lengths
        device = f"device{self.separator}"
        is_global = self.world_size > 1
        elapsed = t1 - t0
        if len(self.window) == self.window_size and elapsed > 0:
            rates = {"batches_per_sec": (b1 - b0) / elapsed, "samples_per_sec": (s1 - s0) / elapsed}
            if has_lengths:
                rates["items_per_sec"] = (l1 - l0) / elapsed
            for name, rate in rates.items():
                metrics[device + name] = rate
                if is_global:
                    metrics[name] = rate * self.world_size
        if len(self.flops) == self.window_size and elapsed > 0:
            flops_per_sec = (sum(self.flops) - self.flops[0]) / elapsed
            if is_global:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[device + "flops_per_sec"] = flops_per_sec / self.world_size
            if self.available_flops:
                metrics[device + "mfu"] = flops_per_sec / self.world_size / self.available_flops
        return {k: v for k, v in metrics.items() if math.isfinite(v)}


class ThroughputMonitor(Callback):
    """Log throughput per stage under Lightning's names, as Lightning's ``ThroughputMonitor``.

    Each training batch (and, outside the sanity check, each validation, test and predict
    batch) adds its samples (``batch_size_fn(batch)``), items (``length_fn(batch)``, e.g.
    tokens) and FLOPs to its stage's counts and to a window of the last ``window_size``
    batches: a few additions, no device sync. Written, with the stage as prefix
    (``train/``, ``validate/``, ``test/``, ``predict/``):

    - ``time`` (seconds since the stage started; validation inside fit left out of training's),
      ``batches``, ``samples`` and, with ``length_fn``, ``lengths``: the totals;
    - once the window is full: ``device/batches_per_sec``, ``device/samples_per_sec``,
      ``device/items_per_sec`` (with ``length_fn``), ``device/flops_per_sec`` and ``device/mfu``
      (with FLOPs, and a known peak for MFU); on several processes also the rates over all of
      them (``batches_per_sec``, ...: the device rate x the world size).

    When (as Lightning): training after each optimizer step the Trainer writes a row for (every
    ``log_every_n_steps``, at that row's step, with ``epoch``); evaluation after every
    ``log_every_n_steps``-th batch of the run, at that batch count. FLOPs per batch are
    ``flops_per_batch``, else the module's ``flops_per_batch`` attribute (Lightning's way); the
    peak is ``available_flops``, else `get_available_flops` for the CUDA device and precision.
    Before a log the device is synchronized once. The latest values are in ``self.metrics``;
    ``total_samples`` and ``train_time`` count the fit (``FitSummary`` reads them).

    Args:
        batch_size_fn: samples in a batch, e.g. ``lambda batch: batch[0].shape[0]``.
        length_fn: items in a batch (tokens: ``lambda batch: batch["input_ids"].numel()``).
        flops_per_batch: FLOPs of one training batch (forward + backward) on one device.
        window_size: batches in the sliding window (>= 2).
        available_flops: the device's peak FLOP/s, overriding the table.
        separator: between ``device`` and a rate's name (Lightning's argument).

    Raises:
        ConfigurationError: an argument has the wrong type or value.

    Examples:
        >>> monitor = ThroughputMonitor(
        ...     batch_size_fn=lambda batch: batch[0].shape[0],  # 32 samples per batch
        ...     flops_per_batch=6 * 124e6 * 32 * 1024,  # 6 · params · tokens
        ...     available_flops=989.4e12,
        ... )
        >>> # at 4 batches/s: train/device/samples_per_sec 128.0, train/device/mfu 0.0985
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int],
        length_fn: Callable[[Any], int] | None = None,
        flops_per_batch: float | None = None,
        window_size: int = 100,
        available_flops: float | None = None,
        separator: str = "/",
    ) -> None:
        for name, function in (("batch_size_fn", batch_size_fn), ("length_fn", length_fn)):
            if function is not None and not callable(function):
                raise ConfigurationError(
                    f"ThroughputMonitor({name}={describe(function)}): expected a function of the "
                    "batch, e.g. lambda batch: batch[0].shape[0]."
                )
        if batch_size_fn is None:
            raise ConfigurationError(
                "ThroughputMonitor(batch_size_fn=None): pass a function of the batch returning "
                "its number of samples, e.g. lambda batch: batch[0].shape[0]."
            )
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 2:
            raise ConfigurationError(
                f"ThroughputMonitor(window_size={describe(window_size)}): expected an int >= 2."
            )
        for name, value in (
            ("flops_per_batch", flops_per_batch),
            ("available_flops", available_flops),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise ConfigurationError(
                    f"ThroughputMonitor({name}={describe(value)}): expected a positive number "
                    "of FLOPs or None."
                )
        if not isinstance(separator, str):
            raise ConfigurationError(
                f"ThroughputMonitor(separator={describe(separator)}): expected a str, e.g. '/'."
            )
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.flops_per_batch = flops_per_batch
        self.window_size = window_size
        self.available_flops = available_flops
        self.separator = separator
        self.metrics: dict[str, float] = {}
        self.stages: dict[str, StageThroughput] = {}
        self._world_size = 1
        self._eval_batches = 0  # batches of the running evaluation
        self._epoch_val_batches = 0  # validation batches since the train epoch started
        self._validation_start: float | None = None

    @property
    def total_samples(self) -> int:
        """Training samples counted since fit started."""
        stage = self.stages.get("train")
        return stage.samples if stage is not None else 0

    @property
    def total_batches(self) -> int:
        """Training batches counted since fit started."""
        stage = self.stages.get("train")
        return stage.batches if stage is not None else 0

    @property
    def total_items(self) -> int:
        """Training items (``length_fn``) counted since fit started."""
        stage = self.stages.get("train")
        return stage.lengths if stage is not None else 0

    @property
    def train_time(self) -> float:
        """Seconds of training since fit started, without the validation inside it."""
        stage = self.stages.get("train")
        return time.perf_counter() - stage.t0 if stage is not None and stage.t0 else 0.0

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._world_size = trainer.world_size
        if self.available_flops is None:
            device = trainer.strategy.root_device
            if device.type == "cuda":
                name = torch.cuda.get_device_name(device)
                self.available_flops = get_available_flops(name, trainer.precision)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("train", reset=True)

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._epoch_val_batches = 0

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._update("train", module, batch)
        if not trainer.accelerator.sync_gradients:  # inside an accumulation window
            return
        if is_log_due(trainer.progress.batches_stepped, trainer):  # a step row is written now
            self._log(trainer, "train", step=None)

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.sanity_checking:
            return
        is_fitting = trainer.state.stage == "fit"
        if is_fitting:
            self._validation_start = time.perf_counter()
        self._start("validate", reset=is_fitting)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking:
            return
        if self._validation_start is None:  # a stand-alone validate: its own batches
            self._eval_batch_end(trainer, module, batch, "validate")
            return
        # Inside fit Lightning numbers the rows by the validation batches of the epoch so far.
        self._epoch_val_batches += 1
        self._eval_batch_end(trainer, module, batch, "validate", step=self._epoch_val_batches)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        train = self.stages.get("train")
        if self._validation_start is not None and train is not None:
            train.t0 += time.perf_counter() - self._validation_start  # not training time
        self._validation_start = None

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("test", reset=False)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, module, batch, "test")

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start("predict", reset=False)

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, module, batch, "predict")

    def compute(self, stage: str = "train") -> dict[str, float]:
        """The metrics of ``stage`` now, with its prefix (empty before its first batch)."""
        counts = self.stages.get(stage)
        if counts is None:
            return {}
        values = counts.compute(has_lengths=self.length_fn is not None)
        return {f"{stage}{self.separator}{key}": value for key, value in values.items()}

    def _start(self, stage: str, *, reset: bool) -> None:
        """A stage starts: its clock and window start again; its totals too when ``reset`` or
        first seen (a stand-alone evaluation run again adds to them, as Lightning's does)."""
        self._eval_batches = 0
        old = self.stages.get(stage)
        counts = self.stages[stage] = StageThroughput(
            self.window_size, self._world_size, self.available_flops, self.separator,
            t0=time.perf_counter(),
        )  # fmt: skip
        if old is not None and not reset:
            counts.batches, counts.samples, counts.lengths = old.batches, old.samples, old.lengths

    def _update(self, stage: str, module: Any, batch: Any) -> None:
        flops = self.flops_per_batch
        if flops is None:
            flops = getattr(module, "flops_per_batch", None)
        lengths = int(self.length_fn(batch)) if self.length_fn is not None else None
        counts = self.stages[stage]
        counts.update(time.perf_counter(), int(self.batch_size_fn(batch)), lengths, flops)

    def _eval_batch_end(
        self, trainer: Trainer, module: Any, batch: Any, stage: str, step: int | None = None
    ) -> None:
        """Count an evaluation batch; log after every ``log_every_n_steps``-th of the run."""
        self._update(stage, module, batch)
        self._eval_batches += 1
        if is_log_due(self._eval_batches, trainer):
            self._log(trainer, stage, step=step if step is not None else self._eval_batches)

    def _log(self, trainer: Trainer, stage: str, *, step: int | None) -> None:
        """Compute ``stage``'s metrics (after one device sync) and write them on rank zero:
        training's at the Trainer's step row (with ``epoch``), evaluation's at ``step``."""
        _synchronize(trainer.strategy.root_device)
        self.metrics = self.compute(stage)
        if self.metrics and trainer.is_global_zero:
            send_to_loggers(trainer, dict(self.metrics), step, has_epoch=step is None)


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the window's last time includes it (only before a log)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
