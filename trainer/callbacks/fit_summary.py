"""FitSummary: the table printed when ``fit`` ends: results, time, throughput, where files are.

This module owns collecting the facts (from public Trainer attributes and, when present, the
ModelCheckpoint, EarlyStopping and ThroughputMonitor callbacks) and printing them with `rich`,
imported when the table is printed (DESIGN §1). It computes nothing the run did not record.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import TYPE_CHECKING, Any

from trainer._imports import require
from trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from rich.console import Console

    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["FitSummary"]

_RICH = {"extra": "all", "feature": "FitSummary"}  # rich is a core dependency of every extra


class FitSummary(Callback):
    """Print a summary table at the end of ``fit`` on global rank zero.

    Rows: epochs and optimizer steps done, wall time of ``fit``, throughput (steps/s, and
    samples/s when a ``ThroughputMonitor`` counted samples), why training stopped early (when
    it did), the best monitored value and checkpoint of ``trainer.checkpoint_callback``, the
    last value of every metric in ``trainer.callback_metrics``, and the checkpoint and log
    directories. The rows are also kept in ``self.rows`` (label, text).

    Args:
        console: the `rich.console.Console` to print to; defaults to one on stdout.

    Examples:
        >>> # Trainer(max_epochs=3, callbacks=[FitSummary(), ModelCheckpoint(monitor="val/loss")])
        >>> # .fit(module, train, val) with 8 batches per epoch ends with:
        >>> #                     Fit summary
        >>> # ┌─────────────────┬───────────────────────────────┐
        >>> # │ Epochs          │ 3                             │
        >>> # │ Steps           │ 24                            │
        >>> # │ Wall time       │ 0.16 s                        │
        >>> # │ Throughput      │ 149 steps/s                   │
        >>> # │ Best val/loss   │ 0.1329                        │
        >>> # │ Best checkpoint │ ./checkpoints/epoch=2-step=24 │
        >>> # │ Checkpoints     │ ./checkpoints                 │
        >>> # │ train/loss      │ 0.1664                        │
        >>> # │ val/loss        │ 0.1329                        │
        >>> # │ Logs            │ ./trainer_logs/version_0      │
        >>> # └─────────────────┴───────────────────────────────┘
    """

    def __init__(self, *, console: Console | None = None) -> None:
        self._console = console
        self._start = 0.0
        self.rows: list[tuple[str, str]] = []

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start = time.monotonic()

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.is_global_zero:
            return
        self.rows = self.collect(trainer, time.monotonic() - self._start)
        self.print_table(self.rows)

    def collect(self, trainer: Trainer, wall_time_s: float) -> list[tuple[str, str]]:
        """The (label, text) rows for ``trainer`` after a fit that took ``wall_time_s``."""
        steps = trainer.global_step
        rows = [
            ("Epochs", str(trainer.current_epoch)),
            ("Steps", str(steps)),
            ("Wall time", _format_duration(wall_time_s)),
        ]
        rates = [f"{steps / wall_time_s:.3g} steps/s"] if wall_time_s > 0 else []
        throughput = _find(trainer, "ThroughputMonitor")
        if throughput is not None and throughput.total_samples and throughput.train_time > 0:
            rates.append(f"{throughput.total_samples / throughput.train_time:.4g} samples/s")
        if rates:
            rows.append(("Throughput", ", ".join(rates)))
        stopper = _find(trainer, "EarlyStopping")
        if stopper is not None and stopper.stopping_reason_message and trainer.should_stop:
            rows.append(("Stopped early", stopper.stopping_reason_message))
        rows += _checkpoint_rows(trainer)
        for name, value in sorted(trainer.callback_metrics.items()):
            if value.numel() == 1:
                rows.append((name, f"{float(value):.4g}"))
        if trainer.loggers:
            rows.append(("Logs", trainer.log_dir))
        return rows

    def print_table(self, rows: list[tuple[str, str]]) -> None:
        """Print ``rows`` as a two-column `rich` table to this callback's console."""
        if self._console is None:
            self._console = require("rich.console", **_RICH).Console()
        table = require("rich.table", **_RICH).Table(title="Fit summary", show_header=False)
        table.add_column("", style="bold")
        table.add_column("", overflow="fold")
        for label, text in rows:
            table.add_row(label, text)
        self._console.print(table)


def _checkpoint_rows(trainer: Trainer) -> list[tuple[str, str]]:
    callback: Any = trainer.checkpoint_callback
    if callback is None:
        return []
    rows = []
    score = getattr(callback, "best_model_score", None)
    best_path = getattr(callback, "best_model_path", "")
    if getattr(callback, "monitor", None) and score is not None:
        rows.append((f"Best {callback.monitor}", f"{float(score):.4g}"))
    if best_path:
        rows.append(("Best checkpoint", best_path))
    if getattr(callback, "dirpath", None):
        rows.append(("Checkpoints", callback.dirpath))
    return rows


def _find(trainer: Trainer, class_name: str) -> Any:
    """The first callback whose class (or a base) is named ``class_name``, without importing it."""
    for callback in trainer.callbacks:
        if any(klass.__name__ == class_name for klass in type(callback).__mro__):
            return callback
    return None


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 60:
        return f"{seconds:.2f} s"
    return str(dt.timedelta(seconds=round(seconds)))
