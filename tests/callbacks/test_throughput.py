"""Tests of trainer/callbacks/throughput.py: the logged rates agree with each other and with the
real step time, validation time is left out, evaluation stages, MFU, the peak-FLOPs table,
argument checks. (Names and log steps against Lightning: tests/parity/test_throughput.py.)"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, ThroughputMonitor
from trainer.callbacks.throughput import get_available_flops
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

    def throughput(self, stage: str = "train") -> list[tuple[int, dict[str, float]]]:
        return [(s, m) for s, m in self.records if f"{stage}/batches" in m]


class SleepyModule(LinearModule):
    def __init__(self, train_s: float = 0.0, val_s: float = 0.0) -> None:
        super().__init__()
        self.train_s, self.val_s = train_s, val_s

    def training_step(self, batch, batch_idx):
        time.sleep(self.train_s)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        time.sleep(self.val_s)
        return super().validation_step(batch, batch_idx)


def batch_size(batch):
    return batch[0].shape[0]


def fit(tmp_path, monitor, module=None, val=None, **kwargs):
    logger = RecordingLogger()
    options = {"max_epochs": 1, "log_every_n_steps": 2, "callbacks": [monitor], "logger": logger}
    options["accelerator"] = "cpu"  # these tests describe CPU runs, also on a GPU machine
    options.update(kwargs)
    run = quiet_trainer(tmp_path, **options)
    run.fit(module or LinearModule(), make_loader(32, 4), val)  # 8 batches of 4 samples
    return run, logger


def test_rates_are_positive_and_consistent(tmp_path):
    monitor = ThroughputMonitor(
        batch_size_fn=batch_size,
        length_fn=lambda batch: batch[0].numel(),  # 4 features per sample
        flops_per_batch=1000.0,
        available_flops=1e6,
        window_size=4,
    )
    _, logger = fit(tmp_path, monitor, SleepyModule(train_s=0.002))
    records = logger.throughput()
    assert [step for step, _ in records] == [1, 3, 5, 7]  # the Trainer's step rows
    assert [m["train/batches"] for _, m in records] == [2, 4, 6, 8]
    assert "train/device/batches_per_sec" not in records[0][1]  # the window is not full yet
    for _, metrics in records[1:]:
        batches = metrics["train/device/batches_per_sec"]
        assert 0 < batches <= 1 / 0.002
        assert metrics["train/device/samples_per_sec"] == pytest.approx(4 * batches)
        assert metrics["train/device/items_per_sec"] == pytest.approx(16 * batches)
        assert metrics["train/device/flops_per_sec"] == pytest.approx(1000.0 * batches)
        assert metrics["train/device/mfu"] == pytest.approx(1000.0 * batches / 1e6)
        assert "train/batches_per_sec" not in metrics  # global rates: several processes only
    assert {k: v for k, v in monitor.metrics.items() if k != "epoch"} == {
        k: v for k, v in records[-1][1].items() if k != "epoch"
    }
    assert (monitor.total_batches, monitor.total_samples, monitor.total_items) == (8, 32, 128)
    assert records[-1][1]["train/samples"] == 32 and records[-1][1]["train/lengths"] == 128
    assert 0 < records[-1][1]["train/time"] <= monitor.train_time


class Clock(Callback):
    """The test's own clock, placed after the monitor: the end time of every training batch
    (index 0: the start of training) and the (start, end) of every validation inside fit."""

    def __init__(self) -> None:
        self.batch_ends: list[float] = []
        self.pauses: list[tuple[float, float]] = []
        self._begun = 0.0

    def on_train_start(self, trainer, module):
        self.batch_ends = [time.perf_counter()]

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.batch_ends.append(time.perf_counter())

    def on_validation_start(self, trainer, module):
        self._begun = time.perf_counter()

    def on_validation_end(self, trainer, module):
        self.pauses.append((self._begun, time.perf_counter()))

    def window(self, step: int, size: int) -> tuple[int, float, float]:
        """Batches, wall seconds and validation seconds of the monitor's window at batch ``step``
        (its last ``size`` updates: the batch ends ``step - size + 1 .. step``)."""
        first = step - size + 1
        begin, end = self.batch_ends[first], self.batch_ends[step]
        paused = sum(b - a for a, b in self.pauses if a >= begin and b <= end)
        return step - first, end - begin, paused


def test_rate_matches_the_real_step_time(tmp_path):
    # The rate is the one the test measures itself, whatever else runs on the machine (the
    # suite runs in 2 workers on 2 cores): no fixed lower bound that a busy machine could miss.
    monitor, clock = ThroughputMonitor(batch_size_fn=batch_size, window_size=3), Clock()
    _, logger = fit(
        tmp_path, monitor, SleepyModule(train_s=0.02), log_every_n_steps=4,
        callbacks=[monitor, clock],
    )  # fmt: skip
    records = logger.throughput()
    assert [step for step, _ in records] == [3, 7]
    for step, metrics in records:
        batches, wall, _ = clock.window(step + 1, 3)
        rate = metrics["train/device/batches_per_sec"]
        assert rate <= 50  # each batch sleeps 20 ms
        assert rate == pytest.approx(batches / wall, rel=0.1), (step, batches, wall)


def test_validation_time_is_left_out(tmp_path):
    monitor, clock = ThroughputMonitor(batch_size_fn=batch_size, window_size=4), Clock()
    module = SleepyModule(train_s=0.01, val_s=0.1)
    _, logger = fit(
        tmp_path, monitor, module, val=make_loader(4, 4), val_check_interval=0.25,
        log_every_n_steps=1, callbacks=[monitor, clock],
    )  # fmt: skip
    records = [(s, m) for s, m in logger.throughput() if "train/device/batches_per_sec" in m]
    assert len(records) == 5 and len(clock.pauses) == 4  # a 0.1 s validation every 2 batches
    paused_steps = []
    for step, metrics in records:
        batches, wall, paused = clock.window(step + 1, 4)
        rate = metrics["train/device/batches_per_sec"]
        assert rate == pytest.approx(batches / (wall - paused), rel=0.1), (step, wall, paused)
        if paused:
            paused_steps.append(step + 1)
            # with the validation counted, the rate would be batches / wall
            assert rate > 1.5 * batches / wall, (step, wall, paused)
    assert paused_steps == [4, 5, 6, 7, 8]  # the windows holding a validation (after 2, 4, 6)
    validations = logger.throughput("validate")
    # each validation counted alone; its rows numbered by the epoch's validation batches so far
    assert [(step, m["validate/batches"]) for step, m in validations] == [
        (i, 1) for i in range(1, 5)
    ]


def test_no_mfu_without_a_known_peak(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=batch_size, flops_per_batch=500.0, window_size=2)
    fit(tmp_path, monitor)
    assert "train/device/flops_per_sec" in monitor.metrics
    assert "train/device/mfu" not in monitor.metrics
    assert "train/device/items_per_sec" not in monitor.metrics


def test_flops_from_the_module_attribute_as_in_lightning(tmp_path):
    module = LinearModule()
    module.flops_per_batch = 250.0
    monitor = ThroughputMonitor(batch_size_fn=batch_size, window_size=2, available_flops=1e3)
    fit(tmp_path, monitor, module)
    rate = monitor.metrics["train/device/batches_per_sec"]
    assert monitor.metrics["train/device/flops_per_sec"] == pytest.approx(250.0 * rate)
    assert monitor.metrics["train/device/mfu"] == pytest.approx(250.0 * rate / 1e3)


def test_test_and_predict_stages_log_their_own_prefix(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=batch_size, window_size=2)
    run, logger = fit(tmp_path, monitor, log_every_n_steps=3)
    run.test(run.module, make_loader(28, 4))  # 7 batches: logged after 3 and 6
    assert [(s, m["test/batches"]) for s, m in logger.throughput("test")] == [(3, 3), (6, 6)]
    run.predict(run.module, make_loader(12, 4))  # 3 batches
    assert monitor.stages["predict"].samples == 12
    run.test(run.module, make_loader(12, 4))  # a second test run adds up, as Lightning's
    assert logger.throughput("test")[-1][1]["test/batches"] == 10


def test_accumulation_counts_every_batch_and_logs_on_steps(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=batch_size, window_size=8)
    _, logger = fit(tmp_path, monitor, accumulate_grad_batches=2, log_every_n_steps=1)
    assert [step for step, _ in logger.throughput()] == [0, 1, 2, 3]
    assert [m["train/batches"] for _, m in logger.throughput()] == [2, 4, 6, 8]
    assert monitor.total_batches == 8


def test_peak_flops_table():
    assert get_available_flops("NVIDIA H100 80GB HBM3", "bf16-mixed") == 989.4e12
    assert get_available_flops("NVIDIA H200", "bf16-true") == 989.4e12
    assert get_available_flops("NVIDIA H100 PCIe", "16-mixed") == 756.5e12
    assert get_available_flops("NVIDIA A100-SXM4-80GB", "bf16-mixed") == 312e12
    assert get_available_flops("NVIDIA A100-SXM4-80GB", "64-true") is None
    assert get_available_flops("NVIDIA GeForce RTX 4090", "bf16-mixed") is None
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert get_available_flops("NVIDIA H100 80GB HBM3", "32-true") == 66.9e12
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores
        assert get_available_flops("NVIDIA H100 80GB HBM3", "32-true") == 494.7e12
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_peak_flops_of_this_gpu_reach_mfu(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=batch_size, flops_per_batch=1e9)
    fit(tmp_path, monitor, accelerator="cuda", precision="bf16-mixed")
    expected = get_available_flops(torch.cuda.get_device_name(), "bf16-mixed")
    assert monitor.available_flops == expected
    assert ("train/device/mfu" in monitor.metrics) == (expected is not None)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"batch_size_fn": None}, "batch_size_fn=None"),
        ({"batch_size_fn": 4}, "batch_size_fn=4 (type int)"),
        ({"length_fn": "tokens"}, "length_fn='tokens'"),
        ({"window_size": 1}, "window_size=1"),
        ({"flops_per_batch": -1.0}, "flops_per_batch=-1.0"),
        ({"available_flops": 0}, "available_flops=0"),
        ({"separator": 1}, "separator=1"),
    ],
)
def test_bad_arguments(kwargs, fragment):
    arguments = {"batch_size_fn": batch_size, **kwargs}
    with pytest.raises(ConfigurationError, match="ThroughputMonitor") as info:
        ThroughputMonitor(**arguments)
    assert fragment in str(info.value)
