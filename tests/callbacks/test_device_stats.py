"""Tests of trainer/callbacks/device_stats.py: the CPU figures (psutil's, and the same read from
/proc without it), when a run logs them and under which names, and the errors.

The rows are compared with Lightning's own DeviceStatsMonitor in tests/parity/test_device_stats.py.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import DeviceStatsMonitor, device_stats
from trainer.callbacks.device_stats import cpu_stats, proc_cpu_stats
from trainer.errors import ConfigurationError
from trainer.loggers import Logger

KEYS = ["cpu_percent", "cpu_swap_percent", "cpu_vm_percent"]
on_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class RecordingLogger(Logger):
    """Keeps every (step, metrics) it receives."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.records.append((step, dict(metrics)))

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        pass

    def stats(self, hook: str = "on_train_batch_end") -> list[tuple[int, dict[str, float]]]:
        prefix = f"DeviceStatsMonitor.{hook}/"
        return [
            (step, {k.removeprefix(prefix): v for k, v in metrics.items()})
            for step, metrics in self.records
            if any(k.startswith(prefix) for k in metrics)
        ]


def fit(tmp_path, monitor, module=None, **kwargs):
    logger = RecordingLogger()
    options = {"max_epochs": 1, "log_every_n_steps": 2, "callbacks": [monitor], "logger": logger}
    options["accelerator"] = "cpu"  # these tests describe CPU runs, also on a GPU machine
    options.update(kwargs)
    quiet_trainer(tmp_path, **options).fit(module or LinearModule(), make_loader(32, 4))
    return logger


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_stats_are_percentages_with_lightnings_names():
    stats = cpu_stats()
    assert sorted(stats) == KEYS
    assert all(0.0 <= value <= 100.0 for value in stats.values())
    assert stats["cpu_vm_percent"] > 0  # this process alone uses some memory


@on_linux
def test_proc_figures_equal_psutils():
    psutil = pytest.importorskip("psutil")
    ours, memory, swap = proc_cpu_stats(), psutil.virtual_memory(), psutil.swap_memory()
    assert ours["cpu_vm_percent"] == pytest.approx(memory.percent, abs=1.0)
    assert ours["cpu_swap_percent"] == pytest.approx(swap.percent, abs=1.0)


@on_linux
def test_proc_cpu_percent_follows_real_work():
    proc_cpu_stats()
    _busy(0.3)  # one core busy the whole interval: at least half of a 2-core machine
    busy = proc_cpu_stats()["cpu_percent"]
    assert 20.0 <= busy <= 100.0


def test_without_psutil_the_figures_come_from_proc(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` raises ImportError
    if not sys.platform.startswith("linux"):
        with pytest.raises(ConfigurationError, match="pip install psutil"):
            cpu_stats()
        return
    assert sorted(cpu_stats()) == KEYS
    monkeypatch.setattr(device_stats, "_MEMINFO", "/proc/no-such-file")
    with pytest.raises(ConfigurationError, match=r"need psutil \(pip install psutil\)"):
        cpu_stats()


def test_a_cpu_run_logs_around_each_due_batch(tmp_path):
    monitor = DeviceStatsMonitor()
    logger = fit(tmp_path, monitor)  # 8 batches, log_every_n_steps=2
    ends, starts = logger.stats(), logger.stats("on_train_batch_start")
    assert [step for step, _ in ends] == [1, 3, 5, 7] == [step for step, _ in starts]
    assert all(sorted(metrics) == KEYS for _, metrics in ends + starts)
    assert sorted(monitor.stats) == [f"DeviceStatsMonitor.on_train_batch_end/{k}" for k in KEYS]


def test_accumulation_logs_every_batch_of_a_due_step(tmp_path):
    logger = fit(tmp_path, DeviceStatsMonitor(), accumulate_grad_batches=2, log_every_n_steps=1)
    assert [step for step, _ in logger.stats()] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_validation_batches_log_by_their_number_in_the_run(tmp_path):
    logger = RecordingLogger()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, logger=logger, callbacks=[DeviceStatsMonitor()], log_every_n_steps=2
    )
    trainer.fit(LinearModule(), make_loader(8, 4), make_loader(20, 4))  # 2 steps, 5 val batches
    # the 2nd and 4th batch of the validation at the epoch's end, at the loggers' step
    assert [step for step, _ in logger.stats("on_validation_batch_end")] == [1, 1]


def test_cpu_stats_false_on_a_cpu_run_logs_nothing(tmp_path):
    monitor = DeviceStatsMonitor(cpu_stats=False)
    assert not any(
        k.startswith("DeviceStats") for _, m in fit(tmp_path, monitor).records for k in m
    )
    assert monitor.stats == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("with_cpu", [None, True])
def test_cuda_memory_stats(tmp_path, with_cpu):
    logger = fit(tmp_path, DeviceStatsMonitor(cpu_stats=with_cpu), accelerator="cuda")
    _, metrics = logger.stats()[-1]
    assert metrics["allocated_bytes.all.current"] > 0  # torch.cuda.memory_stats, all of it
    assert metrics["allocated_bytes.all.peak"] >= metrics["allocated_bytes.all.current"]
    assert ("cpu_percent" in metrics) is bool(with_cpu)


def test_needs_a_logger(tmp_path):
    with pytest.raises(ConfigurationError, match=r"DeviceStatsMonitor needs a logger.*logger="):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[DeviceStatsMonitor()]).fit(
            LinearModule(), make_loader(8, 4)
        )


def test_bad_cpu_stats():
    with pytest.raises(
        ConfigurationError, match=r"cpu_stats='yes' \(type str\).*True, False or None"
    ):
        DeviceStatsMonitor(cpu_stats="yes")
