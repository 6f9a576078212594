"""Tests of trainer/callbacks/fit_summary.py: the rows after a real fit (checkpoint, logger,
throughput, early stopping) and the printed table."""

from __future__ import annotations

import io

from rich.console import Console

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import (
    EarlyStopping,
    FitSummary,
    ModelCheckpoint,
    ThroughputMonitor,
)
from trainer.callbacks.fit_summary import _format_duration
from trainer.loggers import CSVLogger


def captured_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200), buffer


def test_summary_of_a_fit_with_checkpoints_logs_and_throughput(tmp_path):
    console, buffer = captured_console()
    summary = FitSummary(console=console)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val/loss")
    throughput = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0])
    run = quiet_trainer(
        tmp_path,
        max_epochs=3,
        callbacks=[summary, checkpoint, throughput],
        logger=CSVLogger(tmp_path, name="logs"),
        enable_checkpointing=True,
    )
    run.fit(LinearModule(), make_loader(32, 4), make_loader(8, 4, seed=1))
    rows = dict(summary.rows)
    assert (rows["Epochs"], rows["Steps"]) == ("3", "24")
    assert rows["Wall time"].endswith(" s")
    steps_per_sec, samples_per_sec = rows["Throughput"].split(", ")
    assert float(steps_per_sec.removesuffix(" steps/s")) > 0
    assert float(samples_per_sec.removesuffix(" samples/s")) > 0
    assert rows["Best val/loss"] == f"{float(checkpoint.best_model_score):.4g}"
    assert rows["Best checkpoint"] == checkpoint.best_model_path
    assert rows["Checkpoints"] == str(tmp_path / "ckpts")
    metrics = run.callback_metrics
    assert rows["val/loss"] == f"{float(metrics['val/loss']):.4g}"
    assert rows["train/loss"] == f"{float(metrics['train/loss']):.4g}"
    assert rows["Logs"] == run.log_dir
    assert "Stopped early" not in rows
    printed = buffer.getvalue()
    assert "Fit summary" in printed
    for label, text in summary.rows:
        assert label in printed and text in printed


def test_summary_without_checkpoints_or_loggers(tmp_path):
    console, _ = captured_console()
    summary = FitSummary(console=console)
    run = quiet_trainer(tmp_path, max_epochs=1, callbacks=[summary])
    run.fit(LinearModule(), make_loader(8, 4))
    labels = [label for label, _ in summary.rows]
    assert labels == ["Epochs", "Steps", "Wall time", "Throughput", "train/loss"]
    assert "samples/s" not in dict(summary.rows)["Throughput"]


def test_summary_says_why_training_stopped(tmp_path):
    class Flat(LinearModule):
        def validation_step(self, batch, batch_idx):
            self.log("val/score", 1.0)

    console, _ = captured_console()
    summary = FitSummary(console=console)
    stopper = EarlyStopping(monitor="val/score", patience=1)
    run = quiet_trainer(tmp_path, max_epochs=10, callbacks=[summary, stopper])
    run.fit(Flat(), make_loader(8, 4), make_loader(4, 4))
    rows = dict(summary.rows)
    assert rows["Epochs"] == "2"
    assert rows["Stopped early"] == stopper.stopping_reason_message
    assert "did not improve" in rows["Stopped early"]


def test_duration_format():
    assert _format_duration(1.234) == "1.23 s"
    assert _format_duration(3725.4) == "1:02:05"
