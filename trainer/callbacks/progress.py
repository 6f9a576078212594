"""RichProgressBar: the live progress display, or plain log lines when stdout is not a terminal.

This module owns how progress is shown: a `rich` live bar per stage on a terminal, and periodic
one-line summaries elsewhere (CI, SLURM, pytest capture). It reads public Trainer attributes
only and computes no metric; values come from ``trainer.progress_bar_metrics``. `rich` is
imported when a display starts, never when this module is imported (DESIGN §1).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from time import monotonic
from typing import TYPE_CHECKING, Any

from trainer._imports import require
from trainer.callbacks.progress_bar import ProgressBar
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["RichProgressBar", "RichProgressBarTheme"]

_NEVER = sys.maxsize  # a batch count no run reaches: turns the per-batch check off
_RICH = {"extra": "all", "feature": "RichProgressBar"}  # rich is a core dependency of every extra
_EVAL_NAMES = {"validate": "Validation", "test": "Testing", "predict": "Predicting"}
_EVAL_TOTALS = {"test": "num_test_batches", "predict": "num_predict_batches"}


@dataclass
class RichProgressBarTheme:
    """Styles of the live bar's parts (Lightning's ``RichProgressBarTheme``, same fields and
    defaults). Each style is a rich style string (``"bold magenta"``, ``"#6206E0"``, ``"dim"``).

    Args:
        description: the stage name ("Epoch 1/3").
        progress_bar: the bar while running.
        progress_bar_finished: the bar when done.
        progress_bar_pulse: the bar when the total is unknown.
        batch_progress: the "12/300" count.
        time: elapsed and remaining time.
        processing_speed: the "it/s" rate.
        metrics: the metrics' text.
        metrics_text_delimiter: between two metrics.
        metrics_format: the format of a float metric (``".3f"``).
    """

    description: str = ""
    progress_bar: str = "#6206E0"
    progress_bar_finished: str = "#6206E0"
    progress_bar_pulse: str = "#6206E0"
    batch_progress: str = ""
    time: str = "dim"
    processing_speed: str = "dim underline"
    metrics: str = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(ProgressBar):
    """Show progress with a `rich` live bar, or with plain log lines when not on a terminal.

    Per-batch hooks only count and compare. The display and ``trainer.progress_bar_metrics``
    are touched once every ``refresh_rate_s`` seconds (live bar) or ``plain_every_n_steps``
    batches (plain lines), and at each epoch end. Only global rank zero prints.

    Args:
        refresh_rate_s: seconds between two redraws of the live bar; 0 redraws every batch.
        leave: keep each finished epoch bar (and a finished validate/test/predict bar) on screen.
        console: the `rich.console.Console` to draw on; defaults to one on stdout. Its
            ``is_terminal`` chooses between the live bar and plain lines.
        plain_every_n_steps: batches between two plain lines; None uses the Trainer's
            ``log_every_n_steps`` (50 by default).
        refresh_rate: Lightning's argument: batches between two redraws of the live bar instead
            of ``refresh_rate_s`` seconds; 0 shows no bar at all (as in Lightning).
        theme: the live bar's styles (`RichProgressBarTheme`); None keeps rich's defaults.
        console_kwargs: arguments of the ``rich.console.Console`` built when ``console`` is
            None (Lightning's argument), e.g. ``{"force_terminal": True}``.

    Raises:
        ConfigurationError: ``refresh_rate_s`` is negative, ``plain_every_n_steps`` is below 1,
            ``refresh_rate`` is not an int >= 0, ``theme`` is not a `RichProgressBarTheme`, or
            both ``console`` and ``console_kwargs`` are given.

    Examples:
        >>> bar = RichProgressBar(refresh_rate_s=0.5, plain_every_n_steps=100)
        >>> # Off a terminal, with 300 batches per epoch: lines at batches 100 and 200, then
        >>> # "Epoch 1/3  step 300/300  loss=0.4312  val/acc=0.91  12.3 it/s  elapsed 0:00:24"
    """

    def __init__(
        self,
        refresh_rate_s: float = 0.1,
        leave: bool = True,
        console: Console | None = None,
        plain_every_n_steps: int | None = None,
        refresh_rate: int | None = None,
        theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if type(refresh_rate_s) not in (int, float) or refresh_rate_s < 0:  # bool is refused
            raise ConfigurationError(
                f"RichProgressBar(refresh_rate_s=...) expected a number >= 0, received "
                f"{describe(refresh_rate_s)}. Pass e.g. refresh_rate_s=0.1."
            )
        every_n = plain_every_n_steps
        if every_n is not None and (type(every_n) is not int or every_n < 1):
            raise ConfigurationError(
                f"RichProgressBar(plain_every_n_steps=...) expected an int >= 1 or None, received "
                f"{describe(every_n)}. Pass e.g. plain_every_n_steps=50."
            )
        _check_lightning_arguments(refresh_rate, theme, console, console_kwargs)
        super().__init__()
        self.refresh_rate_s = float(refresh_rate_s)
        self.refresh_rate = refresh_rate
        self.leave = leave
        self.plain_every_n_steps = plain_every_n_steps
        self.theme = theme
        self._console = console
        self._console_kwargs = dict(console_kwargs or {})
        self._every_n = 50
        self._is_enabled = refresh_rate != 0
        self._reset()

    @property
    def is_enabled(self) -> bool:
        """Whether the bar shows anything (Lightning's property)."""
        return self._is_enabled

    @property
    def is_disabled(self) -> bool:
        """``not is_enabled``."""
        return not self._is_enabled

    def disable(self) -> None:
        """Show nothing from the next stage on (the Trainer disables it off rank zero)."""
        self._is_enabled = False

    def enable(self) -> None:
        """Show again from the next stage on (not a bar built with ``refresh_rate=0``)."""
        self._is_enabled = self.refresh_rate != 0

    def _reset(self) -> None:
        """Forget the running stage; the next stage start chooses the mode again."""
        self._mode: str | None = None  # "live", "plain" or "off"
        self._progress: Progress | None = None
        self._train_task: TaskID | None = None
        self._eval_task: TaskID | None = None
        self._eval_name, self._is_eval_in_fit = "Validation", False
        self._count = self._eval_count = 0  # batches done in this epoch / evaluation
        self._due_count = self._eval_due_count = _NEVER  # counts from which the clock is read
        self._due_time = math.inf  # next redraw (live); -inf in plain mode
        self._epoch_start = self._eval_start = 0.0
        self._total: float | None = None
        self._eval_total: float | None = None

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._count += 1
        if self._count >= self._due_count and monotonic() >= self._due_time:
            self._refresh(trainer, is_train=True)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_count += 1
        if self._eval_count >= self._eval_due_count and monotonic() >= self._due_time:
            self._refresh(trainer, is_train=False)

    on_test_batch_end = on_predict_batch_end = on_validation_batch_end

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start(trainer)
        self._count, self._epoch_start = 0, monotonic()
        total = trainer.num_training_batches
        self._total = total if math.isfinite(total) else None
        if self._mode == "plain":
            self._due_count = self._every_n
        elif self._mode == "live":
            name = _epoch_name(trainer)
            self._train_task = self._progress.add_task(name, total=self._total, metrics="")
            self._due_count = 0
            self._refresh(trainer, is_train=True)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._due_count = _NEVER
        if self._mode == "plain":
            self._print_line(trainer, is_train=True, is_end=True)
        elif self._mode == "live" and self._train_task is not None:
            self._update_live(trainer, self._train_task, self._count)
            self._finish_task(self._train_task, keep=self.leave)
            self._train_task = None

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start(trainer)
        stage = trainer.state.stage
        stage = str(getattr(stage, "value", stage))  # a str, or an enum whose value is one
        if trainer.sanity_checking:  # num_val_batches is the full count then, as Lightning's
            total = sum(trainer.num_sanity_val_batches)
        else:
            total = getattr(trainer, _EVAL_TOTALS.get(stage, "num_val_batches"))
        self._eval_count, self._eval_start = 0, monotonic()
        self._eval_total = total if math.isfinite(total) else None
        self._is_eval_in_fit = trainer.sanity_checking or stage == "fit"
        name = _EVAL_NAMES.get(stage, "Validation")
        self._eval_name = "Sanity Checking" if trainer.sanity_checking else name
        if self._mode == "plain" and not self._is_eval_in_fit:
            # Inside fit the epoch-end line reports validation; a stand-alone run prints its own.
            self._eval_due_count = self._every_n
        elif self._mode == "live":
            total = self._eval_total
            self._eval_task = self._progress.add_task(self._eval_name, total=total, metrics="")
            self._eval_due_count = 0
            self._progress.refresh()

    on_test_start = on_predict_start = on_validation_start

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_due_count = _NEVER
        if self._mode == "plain" and not self._is_eval_in_fit:
            self._print_line(trainer, is_train=False, is_end=True)
        elif self._mode == "live" and self._eval_task is not None:
            self._update_live(trainer, self._eval_task, self._eval_count)
            self._finish_task(self._eval_task, keep=self.leave and not self._is_eval_in_fit)
            self._eval_task = None
            if self._train_task is not None:  # show the new validation metrics on the train bar
                self._update_live(trainer, self._train_task, self._count)
                self._progress.refresh()

    on_test_end = on_predict_end = on_validation_end

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._stop()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._stop()

    def _start(self, trainer: Trainer) -> None:
        """Choose the mode once per stage; the console (and rich) is only needed from here."""
        if self._mode is not None or not trainer.is_global_zero or not self._is_enabled:
            self._mode = self._mode or "off"  # other ranks show nothing
            return
        if self._console is None:
            self._console = require("rich.console", **_RICH).Console(**self._console_kwargs)
        self._every_n = max(1, int(self.plain_every_n_steps or trainer.log_every_n_steps))
        if not self._console.is_terminal:
            self._mode, self._due_time = "plain", -math.inf
            return
        # With Lightning's refresh_rate the redraws follow batch counts, not the clock.
        self._mode, self._due_time = "live", -math.inf if self.refresh_rate else 0.0
        self._progress = _make_progress(self._console, self.theme)
        self._progress.start()

    def _refresh(self, trainer: Trainer, *, is_train: bool) -> None:
        """Redraw the live bar, or print a plain line; runs once per refresh, not per batch."""
        if self._mode == "live":
            if self.refresh_rate:
                if is_train:
                    self._due_count = self._count + self.refresh_rate
                else:
                    self._eval_due_count = self._eval_count + self.refresh_rate
            else:
                self._due_time = monotonic() + self.refresh_rate_s
            if is_train:
                self._update_live(trainer, self._train_task, self._count)
            else:  # evaluation metrics exist only once the evaluation ends
                self._progress.update(self._eval_task, completed=self._eval_count)
            self._progress.refresh()
        elif is_train:
            self._due_count += self._every_n
            if self._count != self._total:  # the epoch-end line reports the last batch
                self._print_line(trainer, is_train=True, is_end=False)
        else:
            self._eval_due_count += self._every_n
            if self._eval_count != self._eval_total:
                self._print_line(trainer, is_train=False, is_end=False)

    def _print_line(self, trainer: Trainer, *, is_train: bool, is_end: bool) -> None:
        """One plain line: an ETA while running, the elapsed time at the end."""
        if is_train:
            name, count, total = _epoch_name(trainer), self._count, self._total
            seconds = monotonic() - self._epoch_start
        else:
            name, count, total = self._eval_name, self._eval_count, self._eval_total
            seconds = monotonic() - self._eval_start
        line = _format_plain_line(name, count, total, self._metrics(trainer), seconds, is_end)
        # A plain line goes straight to the console's stream: rich's layout engine costs ~0.4 ms
        # a line, which over a 50-step interval is a measurable share of a small model's step.
        stream = self._console.file
        stream.write(line + "\n")
        stream.flush()

    def _metrics(self, trainer: Trainer) -> dict[str, Any]:
        """Progress-bar metrics; none for predict, where values left from fit would mislead."""
        return {} if self._eval_name == "Predicting" else trainer.progress_bar_metrics

    def _update_live(self, trainer: Trainer, task: TaskID, count: int) -> None:
        metrics = _format_metrics(self._metrics(trainer), self.theme)
        self._progress.update(task, completed=count, metrics=metrics)

    def _finish_task(self, task: TaskID, *, keep: bool) -> None:
        """Take a finished bar out of the live area (which would grow), printing it above."""
        progress = self._progress
        if keep:
            done = [t for t in progress.tasks if t.id == task]
            progress.console.print(progress.make_tasks_table(done))
        progress.remove_task(task)
        progress.refresh()

    def _stop(self) -> None:
        """Stop the live display (idempotent), so nothing is left drawing after a stage."""
        if self._progress is not None:
            self._progress.stop()
        self._reset()


def _format_plain_line(
    name: str, count: int, total: float | None, metrics: dict[str, Any], secs: float, is_end: bool
) -> str:
    """One plain line, e.g. ``Epoch 1/3  step 120/300  loss=0.4312  12.3 it/s  ETA 0:00:14``."""
    unit = "step" if name.startswith("Epoch") else "batch"
    parts = [name, f"{unit} {count}" if total is None else f"{unit} {count}/{int(total)}"]
    if metrics:
        parts.append(_format_metrics(metrics))
    rate = count / secs if secs > 0 and count else None
    if rate is not None:
        parts.append(f"{rate:.1f} it/s" if rate >= 1 else f"{rate:.2g} it/s")
    if is_end:
        parts.append(f"elapsed {_format_duration(secs)}")
    elif rate is not None and total is not None:
        parts.append(f"ETA {_format_duration((total - count) / rate)}")
    return "  ".join(parts)


def _format_value(value: Any, float_format: str = ".4g") -> str:
    if hasattr(value, "item"):  # a 0-dim tensor or numpy scalar that slipped through
        value = value.item()
    return format(value, float_format) if isinstance(value, float) else str(value)


def _format_metrics(metrics: Mapping[str, Any], theme: RichProgressBarTheme | None = None) -> str:
    """``name=value`` pairs; with a theme, in its float format and joined by its delimiter."""
    if theme is None:
        return "  ".join(f"{name}={_format_value(value)}" for name, value in metrics.items())
    return theme.metrics_text_delimiter.join(
        f"{name}: {_format_value(value, theme.metrics_format)}" for name, value in metrics.items()
    )


def _format_duration(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _epoch_name(trainer: Trainer) -> str:
    max_epochs, epoch = trainer.max_epochs, trainer.current_epoch + 1  # shown 1-based
    return f"Epoch {epoch}/{max_epochs}" if max_epochs and max_epochs > 0 else f"Epoch {epoch}"


def _make_progress(console: Console, theme: RichProgressBarTheme | None = None) -> Progress:
    """Build the Progress: no auto refresh, so no thread reads our state between redraws.

    With a theme, each part takes its style; rich's own styles name the parts otherwise."""
    rp, text = require("rich.progress", **_RICH), require("rich.text", **_RICH)
    speed_style = theme.processing_speed if theme is not None else "progress.data.speed"

    class _RateColumn(rp.ProgressColumn):
        def render(self, task: Any) -> Any:
            speed = task.finished_speed or task.speed
            return text.Text("" if speed is None else f"{speed:.1f} it/s", style=speed_style)

    if theme is None:
        columns = [rp.TextColumn("[progress.description]{task.description}"), rp.BarColumn()]
        columns += [rp.MofNCompleteColumn(), rp.TimeElapsedColumn(), rp.TextColumn("ETA")]
        columns += [rp.TimeRemainingColumn(), _RateColumn()]
        columns.append(rp.TextColumn("{task.fields[metrics]}", markup=False))
        return rp.Progress(*columns, console=console, auto_refresh=False)
    columns = [
        rp.TextColumn("{task.description}", style=theme.description, markup=False),
        rp.BarColumn(
            complete_style=theme.progress_bar,
            finished_style=theme.progress_bar_finished,
            pulse_style=theme.progress_bar_pulse,
        ),
        rp.TextColumn("{task.completed}/{task.total}", style=theme.batch_progress),
        rp.TextColumn("{task.elapsed:.0f}s", style=theme.time),
        _RateColumn(),
        rp.TextColumn("{task.fields[metrics]}", style=theme.metrics, markup=False),
    ]
    return rp.Progress(*columns, console=console, auto_refresh=False)


def _check_lightning_arguments(
    refresh_rate: object, theme: object, console: object, console_kwargs: object
) -> None:
    if refresh_rate is not None and (type(refresh_rate) is not int or refresh_rate < 0):
        raise ConfigurationError(
            f"RichProgressBar(refresh_rate=...) expected an int >= 0 (batches between redraws; "
            f"0 shows no bar), received {describe(refresh_rate)}. Pass e.g. refresh_rate=10."
        )
    if theme is not None and not isinstance(theme, RichProgressBarTheme):
        raise ConfigurationError(
            f"RichProgressBar(theme=...) expected a RichProgressBarTheme, received "
            f"{describe(theme)}. Pass e.g. theme=RichProgressBarTheme(metrics='green')."
        )
    if console_kwargs is not None and (console is not None or not isinstance(console_kwargs, dict)):
        raise ConfigurationError(
            f"RichProgressBar(console_kwargs=...) expected a dict of Console arguments, given "
            f"without console=, received {describe(console_kwargs)} (console={describe(console)})."
            " Pass one of them."
        )
