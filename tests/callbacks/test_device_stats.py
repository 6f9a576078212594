"""Tests of trainer/callbacks/device_stats.py: RSS follows real allocations, CPU percent follows
real work, when stats are logged, which stats a run gets, and the errors."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import DeviceStatsMonitor
from trainer.callbacks.device_stats import cpu_stats
from trainer.errors import ConfigurationError
from trainer.loggers import Logger


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

    def stats(self) -> list[tuple[int, dict[str, float]]]:
        return [(s, m) for s, m in self.records if any(k.startswith("device_stats/") for k in m)]


def fit(tmp_path, monitor, module=None, **kwargs):
    logger = RecordingLogger()
    options = {"max_epochs": 1, "log_every_n_steps": 2, "callbacks": [monitor], "logger": logger}
    options["accelerator"] = "cpu"  # these tests describe CPU runs, also on a GPU machine
    options.update(kwargs)
    quiet_trainer(tmp_path, **options).fit(module or LinearModule(), make_loader(32, 4))
    return logger


def test_cpu_stats_read_this_process():
    stats = cpu_stats()
    assert stats["cpu_rss_mb"] > 1
    assert stats["cpu_max_rss_mb"] >= stats["cpu_rss_mb"] * 0.99


def test_rss_follows_a_real_allocation(tmp_path):
    class Allocating(LinearModule):
        held: torch.Tensor | None = None

        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                self.held = torch.ones(12_500_000)  # 50 MB, written so it is resident
            return super().training_step(batch, batch_idx)

    logger = fit(tmp_path, DeviceStatsMonitor(), Allocating())  # CPU run: CPU stats by default
    by_step = dict(logger.stats())
    assert sorted(by_step) == [2, 4, 6, 8]
    assert set(by_step[2]) == {
        "device_stats/cpu_rss_mb",
        "device_stats/cpu_max_rss_mb",
        "device_stats/cpu_percent",
    }
    grown = by_step[4]["device_stats/cpu_rss_mb"] - by_step[2]["device_stats/cpu_rss_mb"]
    assert grown > 45


def test_cpu_percent_follows_real_work(tmp_path):
    class Busy(LinearModule):
        def training_step(self, batch, batch_idx):
            end = time.process_time() + 0.01
            while time.process_time() < end:  # uses 10 ms of CPU, however busy the machine is
                pass
            return super().training_step(batch, batch_idx)

    class Sleepy(LinearModule):
        def training_step(self, batch, batch_idx):
            time.sleep(0.01)
            return super().training_step(batch, batch_idx)

    def mean_percent(module):
        monitor = DeviceStatsMonitor(cpu_stats=True)
        values = [m["device_stats/cpu_percent"] for _, m in fit(tmp_path, monitor, module).stats()]
        return sum(values[1:]) / len(values[1:])  # the first covers setup too

    busy, sleepy = mean_percent(Busy()), mean_percent(Sleepy())
    # Alone, busy is ~100 and sleepy a few percent; other processes may halve busy's share.
    assert busy > 2 * sleepy
    assert 0 < sleepy < 50


def test_accumulation_logs_each_step_once(tmp_path):
    logger = fit(tmp_path, DeviceStatsMonitor(), accumulate_grad_batches=2, log_every_n_steps=1)
    assert [step for step, _ in logger.stats()] == [0, 1, 2, 3, 4]


def test_cpu_stats_false_on_a_cpu_run_logs_nothing(tmp_path):
    monitor = DeviceStatsMonitor(cpu_stats=False)
    assert fit(tmp_path, monitor).stats() == []
    assert monitor.stats == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_memory_stats(tmp_path):
    logger = fit(tmp_path, DeviceStatsMonitor(), accelerator="cuda")
    _, metrics = logger.stats()[-1]
    assert "device_stats/cpu_rss_mb" not in metrics  # cpu_stats=None: GPU run, GPU stats only
    assert 0 < metrics["device_stats/cuda_allocated_mb"] <= metrics["device_stats/cuda_reserved_mb"]
    assert (
        metrics["device_stats/cuda_max_allocated_mb"] >= metrics["device_stats/cuda_allocated_mb"]
    )


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
