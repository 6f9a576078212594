"""DeviceStatsMonitor: log the device's statistics around every logged batch, as Lightning does.

This module owns reading the statistics (system memory, swap and CPU use — psutil's figures,
read from ``/proc`` where psutil is not installed; ``torch.cuda.memory_stats`` for a GPU) and
writing them to ``trainer.loggers`` from the batch hooks of training, validation and test. It
reads, never frees or resets, memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.logger_rows import is_log_due, logging_step

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["DeviceStatsMonitor", "cpu_stats"]

_STAT = "/proc/stat"
_MEMINFO = "/proc/meminfo"
_last_cpu_times: tuple[int, int] | None = None  # (busy, total) jiffies at the previous read


def cpu_stats() -> dict[str, float]:
    """The machine's memory, CPU and swap use, in percent, with Lightning's names.

    ``cpu_vm_percent`` (memory in use: total less available), ``cpu_percent`` (all cores' busy
    time since the previous call; 0.0 on the first) and ``cpu_swap_percent``. From psutil when
    it is installed (Lightning's source), otherwise from ``/proc`` the way psutil computes them.

    Raises:
        ConfigurationError: neither psutil nor ``/proc`` is there (not Linux, no psutil).

    Examples:
        >>> sorted(cpu_stats())
        ['cpu_percent', 'cpu_swap_percent', 'cpu_vm_percent']
    """
    try:
        import psutil
    except ImportError:
        return proc_cpu_stats()
    return {
        "cpu_vm_percent": psutil.virtual_memory().percent,
        "cpu_percent": psutil.cpu_percent(),
        "cpu_swap_percent": psutil.swap_memory().percent,
    }


def proc_cpu_stats() -> dict[str, float]:
    """`cpu_stats` from ``/proc/meminfo`` and ``/proc/stat`` (Linux, without psutil)."""
    global _last_cpu_times
    try:
        with open(_MEMINFO, encoding="ascii") as file:
            kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in file)}
        with open(_STAT, encoding="ascii") as file:
            jiffies = [int(v) for v in file.readline().split()[1:]]
    except (OSError, ValueError, IndexError) as err:
        raise ConfigurationError(
            "DeviceStatsMonitor: CPU statistics need psutil (pip install psutil) where "
            f"/proc/meminfo and /proc/stat cannot be read ({err})."
        ) from err
    total = sum(jiffies[:8])  # user .. steal (guest time is inside user and nice)
    busy = total - jiffies[3] - (jiffies[4] if len(jiffies) > 4 else 0)  # less idle, iowait
    last_busy, last_total = _last_cpu_times or (busy, total)
    _last_cpu_times = (busy, total)
    elapsed = total - last_total
    return {
        "cpu_vm_percent": _percent(kib["MemTotal"] - kib["MemAvailable"], kib["MemTotal"]),
        "cpu_percent": _percent(busy - last_busy, elapsed),
        "cpu_swap_percent": _percent(kib["SwapTotal"] - kib["SwapFree"], kib["SwapTotal"]),
    }


def _percent(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0


class DeviceStatsMonitor(Callback):
    """Log the device's statistics at the start and end of training, validation and test
    batches, with Lightning's names, steps and rule.

    Keys are ``DeviceStatsMonitor.<hook>/<statistic>``, e.g.
    ``DeviceStatsMonitor.on_train_batch_end/cpu_percent``. A CPU run logs `cpu_stats`
    (``cpu_vm_percent``, ``cpu_percent``, ``cpu_swap_percent``); a CUDA run logs every figure of
    ``torch.cuda.memory_stats`` (``allocated_bytes.all.current``, ...), plus the CPU ones with
    ``cpu_stats=True``. A training batch logs when its step is due (``(batches that stepped + 1)
    % log_every_n_steps == 0``, so with accumulation every batch of a due step does), an
    evaluation batch when its number in the run is a multiple of ``log_every_n_steps``, and
    every batch once the fit is stopping. The step is the loggers' training step. The latest
    values are in ``self.stats``. Reading them costs no device sync.

    Args:
        cpu_stats: on a CPU run, False logs nothing; on a GPU run, True adds the CPU figures.

    Raises:
        ConfigurationError: ``cpu_stats`` is not a bool or None; fit starts with no logger.

    Examples:
        >>> monitor = DeviceStatsMonitor()
        >>> # Trainer(callbacks=[monitor], log_every_n_steps=50) logs e.g.
        >>> # {"DeviceStatsMonitor.on_train_batch_end/cpu_percent": 97.0, ...} at steps 49, 99, ...
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        if cpu_stats is not None and not isinstance(cpu_stats, bool):
            raise ConfigurationError(
                f"DeviceStatsMonitor(cpu_stats={describe(cpu_stats)}): expected True, False or "
                "None (on a CPU run False logs nothing; on a GPU run True adds CPU statistics)."
            )
        self.cpu_stats = cpu_stats
        self.stats: dict[str, float] = {}
        self._eval_batches = 0  # batches of the current validation / test run

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            raise ConfigurationError(
                "DeviceStatsMonitor needs a logger, but the Trainer has none (logger=False). "
                "Pass Trainer(logger=True) or a Logger, or remove the callback."
            )

    def read(self, trainer: Trainer) -> dict[str, float]:
        """The statistics now, without the hook's prefix (empty: nothing to log)."""
        device = trainer.strategy.root_device
        if device.type == "cpu":
            return {} if self.cpu_stats is False else cpu_stats()
        stats: dict[str, float] = {}
        if device.type == "cuda":
            stats.update(torch.cuda.memory_stats(device))
        if self.cpu_stats:
            stats.update(cpu_stats())
        return stats

    def _log(self, trainer: Trainer, hook: str, position: int, step: int) -> None:
        if not is_log_due(position, trainer):
            return
        stats = self.read(trainer)
        if not stats:
            return
        self.stats = {f"DeviceStatsMonitor.{hook}/{name}": value for name, value in stats.items()}
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(dict(self.stats), step=step)

    # ---- training: the step about to be taken (start) and the one just taken (end) ----------
    def on_train_batch_start(
        self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.progress.batches_stepped
        self._log(trainer, "on_train_batch_start", step + 1, step)

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = logging_step(trainer)  # the batches that stepped before this one
        self._log(trainer, "on_train_batch_end", step + 1, step)

    # ---- evaluation: the batch's number in this run ----------------------------------------
    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_batches = 0

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_batches = 0

    def on_validation_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batches += 1
        self._log(trainer, "on_validation_batch_start", self._eval_batches, logging_step(trainer))

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log(trainer, "on_validation_batch_end", self._eval_batches, logging_step(trainer))

    def on_test_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batches += 1
        self._log(trainer, "on_test_batch_start", self._eval_batches, logging_step(trainer))

    def on_test_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log(trainer, "on_test_batch_end", self._eval_batches, logging_step(trainer))
