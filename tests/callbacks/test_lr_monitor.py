"""Tests of trainer/callbacks/lr_monitor.py: names, intervals, real schedulers, the metrics that
reach a real Logger subclass and CSVLogger's metrics.csv."""

from __future__ import annotations

import csv
from typing import Any

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import LearningRateMonitor
from trainer.errors import ConfigurationError
from trainer.loggers import CSVLogger, Logger


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

    def values(self, name: str) -> list[tuple[int, float]]:
        return [(step, m[name]) for step, m in self.records if name in m]

    def lr_records(self) -> list[tuple[int, dict[str, float]]]:
        """The records of the monitor (the Trainer's own metrics left out)."""
        return [(step, m) for step, m in self.records if any(k.startswith("lr-") for k in m)]


class ScheduledModule(LinearModule):
    def __init__(self, interval: str = "epoch", momentum: float = 0.0) -> None:
        super().__init__(lr=0.1)
        self.interval = interval
        self.momentum = momentum

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=self.momentum)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.interval},
        }


def fit(tmp_path, module, monitor, logger, **kwargs):
    options = {"max_epochs": 3, "log_every_n_steps": 1, "callbacks": [monitor], "logger": logger}
    options.update(kwargs)
    run = quiet_trainer(tmp_path, **options)
    run.fit(module, make_loader(16, 4))  # 4 batches per epoch
    return run


def test_epoch_scheduler_is_logged_at_each_epoch_start(tmp_path):
    logger = RecordingLogger()
    monitor = LearningRateMonitor()
    fit(tmp_path, ScheduledModule("epoch"), monitor, logger)
    assert logger.values("lr-SGD") == [(0, 0.1), (4, 0.05), (8, 0.025)]
    assert monitor.lrs == {"lr-SGD": [0.1, 0.05, 0.025]}


def test_step_scheduler_is_logged_every_logging_step(tmp_path):
    logger = RecordingLogger()
    fit(tmp_path, ScheduledModule("step"), LearningRateMonitor(), logger, max_epochs=1)
    assert logger.values("lr-SGD") == [(0, 0.1), (1, 0.05), (2, 0.025), (3, 0.0125)]


def test_log_every_n_steps_and_accumulation_log_each_batch_of_a_due_step(tmp_path):
    logger = RecordingLogger()
    monitor = LearningRateMonitor(logging_interval="step")
    module = ScheduledModule("step")
    fit(tmp_path, module, monitor, logger, max_epochs=2, log_every_n_steps=2)
    # logged where (global_step + 1) % 2 == 0: steps 1, 3, 5, 7
    assert [step for step, _ in logger.values("lr-SGD")] == [1, 3, 5, 7]
    logger = RecordingLogger()
    fit(tmp_path, module, LearningRateMonitor(logging_interval="step"), logger,
        max_epochs=1, accumulate_grad_batches=2)  # fmt: skip
    # Lightning's rule is checked per batch: both batches of each step log it
    assert [step for step, _ in logger.values("lr-SGD")] == [0, 0, 1, 1]


def test_logging_interval_epoch_logs_step_schedulers_at_epoch_start(tmp_path):
    logger = RecordingLogger()
    fit(tmp_path, ScheduledModule("step"), LearningRateMonitor("epoch"), logger)
    # as Lightning: "epoch" logs every optimizer at each epoch start, whatever its interval
    assert [step for step, _ in logger.values("lr-SGD")] == [0, 4, 8]


def test_param_groups_momentum_and_weight_decay(tmp_path):
    class TwoGroups(LinearModule):
        def configure_optimizers(self):
            return torch.optim.Adam(
                [
                    {"params": [self.net.weight], "lr": 0.01},
                    {"params": [self.net.bias], "lr": 0.02, "weight_decay": 0.1},
                ],
                betas=(0.8, 0.99),
            )

    logger = RecordingLogger()
    monitor = LearningRateMonitor("epoch", log_momentum=True, log_weight_decay=True)
    fit(tmp_path, TwoGroups(), monitor, logger, max_epochs=1)
    assert logger.lr_records() == [
        (
            0,
            {
                "lr-Adam/pg1": 0.01,
                "lr-Adam/pg1-momentum": 0.8,
                "lr-Adam/pg1-weight_decay": 0.0,
                "lr-Adam/pg2": 0.02,
                "lr-Adam/pg2-momentum": 0.8,
                "lr-Adam/pg2-weight_decay": 0.1,
            },
        )
    ]


def test_duplicate_optimizer_classes_and_scheduler_names(tmp_path):
    class TwoSGD(LinearModule):
        automatic_optimization = False

        def training_step(self, batch, batch_idx):
            for optimizer in self.optimizers():
                optimizer.zero_grad()
                x, y = batch
                self.manual_backward(torch.nn.functional.mse_loss(self(x), y))
                optimizer.step()

        def configure_optimizers(self):
            first = torch.optim.SGD(self.parameters(), lr=0.1)
            second = torch.optim.SGD(self.parameters(), lr=0.2)
            third = torch.optim.SGD(self.parameters(), lr=0.3)
            named = torch.optim.lr_scheduler.StepLR(third, step_size=1)
            return [first, second, third], [{"scheduler": named, "name": "lr-third"}]

    logger = RecordingLogger()
    fit(tmp_path, TwoSGD(), LearningRateMonitor("epoch"), logger, max_epochs=1)
    assert logger.lr_records() == [(0, {"lr-SGD": 0.1, "lr-SGD-1": 0.2, "lr-third": 0.3})]


def test_csv_logger_gets_an_lr_column(tmp_path):
    logger = CSVLogger(tmp_path, name="run")
    fit(tmp_path, ScheduledModule("epoch"), LearningRateMonitor(), logger)
    with open(f"{logger.log_dir}/metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["lr-SGD"]]
    assert [(int(row["step"]), float(row["lr-SGD"])) for row in rows] == [
        (0, 0.1),
        (4, 0.05),
        (8, 0.025),
    ]


def test_no_logger_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match=r"LearningRateMonitor needs a logger.*logger="):
        fit(tmp_path, ScheduledModule(), LearningRateMonitor(), logger=False)


def test_bad_logging_interval():
    with pytest.raises(ConfigurationError, match=r"logging_interval='batch'.*'step' or 'epoch'"):
        LearningRateMonitor(logging_interval="batch")
