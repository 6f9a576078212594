"""ThroughputMonitor: samples, batches, items (tokens) per second and MFU during training.

This module owns the sliding window of (wall time, batches, samples, items) points, the rates
computed from it, the table of known device peak FLOPs (`get_available_flops`), and when
the rates are written to ``trainer.loggers``. It counts what the user's ``batch_size_fn`` and
``length_fn`` say; it does not measure FLOPs (pass ``flops_per_batch``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["ThroughputMonitor", "get_available_flops"]

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


class ThroughputMonitor(Callback):
    """Log training throughput: samples/s, batches/s, items/s and model FLOPs utilization.

    After each training batch it records ``time.perf_counter()`` and the running counts of
    batches, samples (``batch_size_fn(batch)``) and items (``length_fn(batch)``, e.g. tokens) in
    a window of the last ``window_size`` batches: a few additions per batch, no device sync.
    When the Trainer logs (every ``log_every_n_steps`` optimizer steps) it computes the rates
    over the window and writes, to every logger at ``step=global_step``:

    - ``throughput/batches_per_sec`` and ``throughput/samples_per_sec``;
    - ``throughput/items_per_sec`` when ``length_fn`` is given;
    - ``throughput/flops_per_sec`` when ``flops_per_batch`` is given, and ``throughput/mfu``
      (= flops_per_batch × batches/s ÷ peak FLOP/s) when the peak is known as well: from
      ``available_flops``, else from `get_available_flops` for the CUDA device and the
      Trainer's precision.

    Rates are per process: each counts its own batches. Before a log the device is synchronized
    once, so queued GPU work is counted; the time spent in validation inside fit is left out.
    The latest values are also in ``self.metrics``; ``total_samples`` and ``train_time`` count
    the whole run (``FitSummary`` reads them).

    Args:
        batch_size_fn: samples in a batch, e.g. ``lambda batch: batch[0].shape[0]``.
        length_fn: items in a batch (tokens: ``lambda batch: batch["input_ids"].numel()``).
        flops_per_batch: FLOPs of one training batch (forward + backward) on one device.
        window_size: batches in the sliding window (>= 2).
        available_flops: the device's peak FLOP/s, overriding the table.

    Raises:
        ConfigurationError: an argument has the wrong type or value.

    Examples:
        >>> monitor = ThroughputMonitor(
        ...     batch_size_fn=lambda batch: batch[0].shape[0],  # 32 samples per batch
        ...     flops_per_batch=6 * 124e6 * 32 * 1024,  # 6 · params · tokens
        ...     available_flops=989.4e12,
        ... )
        >>> # at 4 batches/s: samples_per_sec 128.0, mfu = 2.44e13 * 4 / 9.894e14 = 0.0985
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int],
        length_fn: Callable[[Any], int] | None = None,
        flops_per_batch: float | None = None,
        window_size: int = 100,
        available_flops: float | None = None,
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
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.flops_per_batch = flops_per_batch
        self.window_size = window_size
        self.available_flops = available_flops
        self.metrics: dict[str, float] = {}
        self.total_samples = 0
        self.total_batches = 0
        self.total_items = 0
        self._window: deque[tuple[float, int, int, int]] = deque(maxlen=window_size)
        self._paused_s = 0.0  # validation time inside fit, left out of the rates
        self._pause_start: float | None = None
        self._train_start = 0.0
        self._last_logged_step = -1

    @property
    def train_time(self) -> float:
        """Seconds of training since fit started, without the validation inside it."""
        return self._now() - self._train_start if self._train_start else 0.0

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage == "fit" and self.available_flops is None:
            device = trainer.strategy.root_device
            if device.type == "cuda":
                name = torch.cuda.get_device_name(device)
                self.available_flops = get_available_flops(name, trainer.precision)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._window.clear()
        self.total_samples = self.total_batches = self.total_items = 0
        self._paused_s = 0.0
        self._train_start = self._now()
        self._window.append((self._train_start, 0, 0, 0))
        self._last_logged_step = -1

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.total_batches += 1
        self.total_samples += int(self.batch_size_fn(batch))
        if self.length_fn is not None:
            self.total_items += int(self.length_fn(batch))
        step = trainer.global_step
        is_log_due = step % trainer.log_every_n_steps == 0 and step != self._last_logged_step
        if is_log_due and trainer.accelerator.sync_gradients:
            self._last_logged_step = step
            _synchronize(trainer.strategy.root_device)
            self._record()
            self.metrics = self.compute()
            if self.metrics and trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.log_metrics(dict(self.metrics), step=step)
        else:
            self._record()

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.state.stage == "fit" and not trainer.sanity_checking:
            self._pause_start = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._pause_start is not None:
            self._paused_s += time.perf_counter() - self._pause_start
            self._pause_start = None

    def compute(self) -> dict[str, float]:
        """The rates over the current window (empty until it holds two points)."""
        if len(self._window) < 2:
            return {}
        (t0, b0, s0, i0), (t1, b1, s1, i1) = self._window[0], self._window[-1]
        elapsed = t1 - t0
        if elapsed <= 0:
            return {}
        batches_per_sec = (b1 - b0) / elapsed
        metrics = {
            "throughput/batches_per_sec": batches_per_sec,
            "throughput/samples_per_sec": (s1 - s0) / elapsed,
        }
        if self.length_fn is not None:
            metrics["throughput/items_per_sec"] = (i1 - i0) / elapsed
        if self.flops_per_batch is not None:
            flops_per_sec = self.flops_per_batch * batches_per_sec
            metrics["throughput/flops_per_sec"] = flops_per_sec
            if self.available_flops:
                metrics["throughput/mfu"] = flops_per_sec / self.available_flops
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def _record(self) -> None:
        point = (self._now(), self.total_batches, self.total_samples, self.total_items)
        self._window.append(point)

    def _now(self) -> float:
        return time.perf_counter() - self._paused_s


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the window's last time includes it (only before a log)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
