"""DeviceStatsMonitor: log host memory and CPU use, and CUDA memory, while training.

This module owns reading the statistics (``/proc/self/status`` or ``resource.getrusage`` for the
process; ``torch.cuda.memory_*`` for the GPU; no psutil) and writing them to ``trainer.loggers``
every ``log_every_n_steps`` optimizer steps. It reads, never frees or resets, memory.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["DeviceStatsMonitor", "cpu_stats", "cuda_stats"]

_MB = 1e6
_PREFIX = "device_stats/"


def cpu_stats() -> dict[str, float]:
    """This process's resident memory now and at its peak, in MB (10⁶ bytes).

    Returns:
        ``{"cpu_rss_mb": ..., "cpu_max_rss_mb": ...}``; ``cpu_rss_mb`` is missing where
        ``/proc/self/status`` is not readable (not Linux).

    Examples:
        >>> sorted(cpu_stats())  # on Linux
        ['cpu_max_rss_mb', 'cpu_rss_mb']
    """
    stats: dict[str, float] = {}
    rss_kib = _read_vm_rss_kib()
    if rss_kib is not None:
        stats["cpu_rss_mb"] = rss_kib * 1024 / _MB
    try:
        import resource
    except ImportError:  # Windows has no resource module
        return stats
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats["cpu_max_rss_mb"] = peak / _MB if sys.platform == "darwin" else peak * 1024 / _MB
    return stats


def cuda_stats(device: torch.device) -> dict[str, float]:
    """Memory allocated, reserved and the peak allocated on ``device`` since start, in MB.

    Examples:
        >>> cuda_stats(torch.device("cuda", 0))  # doctest: +SKIP
        {'cuda_allocated_mb': 512.1, 'cuda_reserved_mb': 1024.5, 'cuda_max_allocated_mb': 900.0}
    """
    return {
        "cuda_allocated_mb": torch.cuda.memory_allocated(device) / _MB,
        "cuda_reserved_mb": torch.cuda.memory_reserved(device) / _MB,
        "cuda_max_allocated_mb": torch.cuda.max_memory_allocated(device) / _MB,
    }


class DeviceStatsMonitor(Callback):
    """Log memory and CPU statistics every ``log_every_n_steps`` optimizer steps.

    At the end of a training batch whose step is due for logging, it writes to every logger at
    ``step=global_step`` (names under ``device_stats/``):

    - CPU, when ``cpu_stats`` is True, or None and training runs on the CPU:
      ``cpu_rss_mb`` (resident memory now), ``cpu_max_rss_mb`` (its peak), and
      ``cpu_percent``, the process's CPU time over wall time since the previous log
      (100 = one core busy);
    - CUDA, when training runs on a GPU: ``cuda_allocated_mb``, ``cuda_reserved_mb``,
      ``cuda_max_allocated_mb``.

    Reading them costs no device sync. The latest values are also in ``self.stats``.

    Args:
        cpu_stats: log the CPU statistics: True always, False never, None on a CPU run only.

    Raises:
        ConfigurationError: ``cpu_stats`` is not a bool or None; fit starts with no logger.

    Examples:
        >>> monitor = DeviceStatsMonitor(cpu_stats=True)
        >>> # Trainer(callbacks=[monitor], log_every_n_steps=50) logs e.g.
        >>> # {"device_stats/cpu_rss_mb": 812.4, "device_stats/cpu_percent": 97.0, ...}
        >>> # at steps 50, 100, ...
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        if cpu_stats is not None and not isinstance(cpu_stats, bool):
            raise ConfigurationError(
                f"DeviceStatsMonitor(cpu_stats={describe(cpu_stats)}): expected True, False or "
                "None (CPU statistics on CPU runs only)."
            )
        self.cpu_stats = cpu_stats
        self.stats: dict[str, float] = {}
        self._is_cpu_logged = False
        self._last_logged_step = -1
        self._last_times = (0.0, 0.0)  # (wall, process CPU) at the previous log

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise ConfigurationError(
                "DeviceStatsMonitor needs a logger, but the Trainer has none (logger=False). "
                "Pass Trainer(logger=True) or a Logger, or remove the callback."
            )
        device = trainer.strategy.root_device
        self._is_cpu_logged = self.cpu_stats is True or (
            self.cpu_stats is None and device.type == "cpu"
        )
        self._last_logged_step = -1
        self._last_times = (time.perf_counter(), time.process_time())

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % trainer.log_every_n_steps != 0 or step == self._last_logged_step:
            return
        self._last_logged_step = step
        self.stats = {f"{_PREFIX}{k}": v for k, v in self.read(trainer).items()}
        if self.stats and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(dict(self.stats), step=step)

    def read(self, trainer: Trainer) -> dict[str, float]:
        """The statistics now, without the ``device_stats/`` prefix."""
        stats: dict[str, float] = {}
        if self._is_cpu_logged:
            stats.update(cpu_stats())
            wall, cpu = time.perf_counter(), time.process_time()
            last_wall, last_cpu = self._last_times
            if wall > last_wall:
                stats["cpu_percent"] = 100.0 * (cpu - last_cpu) / (wall - last_wall)
            self._last_times = (wall, cpu)
        device = trainer.strategy.root_device
        if device.type == "cuda":
            stats.update(cuda_stats(device))
        return stats


def _read_vm_rss_kib() -> int | None:
    """VmRSS of this process from /proc (Linux), in KiB; None where it cannot be read."""
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as file:
            for line in file:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None
