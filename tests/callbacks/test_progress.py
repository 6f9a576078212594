"""Tests of trainer/callbacks/progress.py: plain lines, refresh discipline, live bar, cost."""

from __future__ import annotations

import io
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from trainer.callbacks import progress as progress_module
from trainer.callbacks.progress import RichProgressBar, RichProgressBarTheme, _format_plain_line
from trainer.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
# 2 epochs of 10 batches, a line every 4: at 4 and 8, and at each epoch end.
EXPECTED_HEADS = [f"Epoch {epoch}/2  step {step}/10" for epoch in (1, 2) for step in (4, 8, 10)]


class FakeTrainer:
    """The public Trainer attributes the bar reads; counts reads of progress_bar_metrics."""

    def __init__(self, *, batches: float = 10, max_epochs: int | None = 2, **changes: Any) -> None:
        self.current_epoch, self.max_epochs, self.global_step, self.max_steps = 0, max_epochs, 0, -1
        self.num_training_batches, self.num_val_batches = batches, 3
        self.num_test_batches, self.num_predict_batches = 8, 5
        self.num_sanity_val_batches = [2]  # the sanity check's count; num_val_batches stays 3
        self.sanity_checking, self.is_global_zero, self.log_every_n_steps = False, True, 50
        self.state = types.SimpleNamespace(stage="fit")
        self.metrics: dict[str, float] = {"loss": 0.43124}
        self.reads = 0
        self.__dict__.update(changes)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        self.reads += 1
        return dict(self.metrics)


def make_console(*, is_terminal: bool = False) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=is_terminal, width=160), buffer


def run_epoch(bar: RichProgressBar, trainer: FakeTrainer, *, val_batches: int = 0) -> None:
    bar.on_train_epoch_start(trainer, None)
    for batch_idx in range(int(trainer.num_training_batches)):
        bar.on_train_batch_end(trainer, None, None, None, batch_idx)
    if val_batches:
        run_eval(bar, trainer, val_batches, "validation")
    bar.on_train_epoch_end(trainer, None)


def run_eval(bar: RichProgressBar, trainer: FakeTrainer, batches: int, stage: str) -> None:
    getattr(bar, f"on_{stage}_start")(trainer, None)
    for batch_idx in range(batches):
        getattr(bar, f"on_{stage}_batch_end")(trainer, None, None, None, batch_idx)
    getattr(bar, f"on_{stage}_end")(trainer, None)


def heads(buffer: io.StringIO) -> list[str]:
    """Each line up to its metrics: the part that does not depend on timing."""
    return [line.split("  loss")[0] for line in buffer.getvalue().splitlines()]


def test_format_step_line() -> None:
    metrics = {"loss": 0.43124, "val/acc": 0.91}
    line = _format_plain_line("Epoch 1/3", 120, 300, metrics, 10.0, False)
    # 120 batches in 10 s = 12 it/s; 180 left -> 15 s.
    assert line == "Epoch 1/3  step 120/300  loss=0.4312  val/acc=0.91  12.0 it/s  ETA 0:00:15"


def test_format_end_line_shows_elapsed() -> None:
    line = _format_plain_line("Epoch 2/3", 300, 300, {"loss": 0.5}, 3725.0, True)
    assert line == "Epoch 2/3  step 300/300  loss=0.5  0.081 it/s  elapsed 1:02:05"  # 300 / 3725 s


def test_format_four_significant_digits_and_other_values() -> None:
    metrics = {"a": 123456.0, "b": 0.000123456, "c": 3, "d": torch.tensor(2.71828), "e": True}
    line = _format_plain_line("Testing", 4, 8, metrics, 0.0, False)
    assert line == "Testing  batch 4/8  a=1.235e+05  b=0.0001235  c=3  d=2.718  e=True"


def test_format_unknown_total_has_no_eta() -> None:
    line = _format_plain_line("Epoch 1", 7, None, {}, 2.0, False)
    assert line == "Epoch 1  step 7  3.5 it/s"


def test_plain_lines_at_every_n_and_epoch_end() -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=4)
    trainer = FakeTrainer(batches=10)
    for epoch in range(2):
        trainer.current_epoch = epoch
        run_epoch(bar, trainer)
    bar.teardown(trainer, None, "fit")
    assert heads(buffer) == EXPECTED_HEADS
    lines = buffer.getvalue().splitlines()
    assert "ETA" in lines[0] and "elapsed" not in lines[0]
    assert "elapsed" in lines[2] and "ETA" not in lines[2]
    assert trainer.reads == 6  # once per line, never on the other 14 batches


def test_plain_last_batch_is_reported_once() -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=4)
    run_epoch(bar, FakeTrainer(batches=8, max_epochs=None))
    assert heads(buffer) == ["Epoch 1  step 4/8", "Epoch 1  step 8/8"]


def test_plain_uses_log_every_n_steps_by_default() -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console)
    run_epoch(bar, FakeTrainer(batches=7, log_every_n_steps=3))
    assert heads(buffer) == ["Epoch 1/2  step 3/7", "Epoch 1/2  step 6/7", "Epoch 1/2  step 7/7"]


def test_plain_epoch_line_carries_validation_metrics() -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=100)
    trainer = FakeTrainer(batches=5)
    trainer.sanity_checking = True
    run_eval(bar, trainer, 2, "validation")
    trainer.sanity_checking = False
    trainer.metrics["val/acc"] = 0.91  # read only at the epoch end, after validation
    run_epoch(bar, trainer, val_batches=3)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 1  # validation inside fit prints no line of its own
    assert lines[0].startswith("Epoch 1/2  step 5/5  loss=0.4312  val/acc=0.91  ")
    assert trainer.reads == 1


@pytest.mark.parametrize(("stage", "name"), [("test", "Testing"), ("validate", "Validation")])
def test_plain_standalone_evaluation(stage: str, name: str) -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=3)
    trainer = FakeTrainer(state=types.SimpleNamespace(stage=stage), num_val_batches=8)
    run_eval(bar, trainer, 8, "test" if stage == "test" else "validation")
    bar.teardown(trainer, None, stage)
    assert heads(buffer) == [f"{name}  batch 3/8", f"{name}  batch 6/8", f"{name}  batch 8/8"]
    assert "elapsed" in buffer.getvalue().splitlines()[-1]


def test_plain_predict_has_no_metrics() -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=100)
    trainer = FakeTrainer(state=types.SimpleNamespace(stage="predict"))
    run_eval(bar, trainer, 5, "predict")
    assert buffer.getvalue().startswith("Predicting  batch 5/5  ")
    assert "loss" not in buffer.getvalue()
    assert trainer.reads == 0


def test_other_ranks_print_nothing_and_read_nothing() -> None:
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=1)
    trainer = FakeTrainer(is_global_zero=False)
    run_epoch(bar, trainer, val_batches=3)
    bar.teardown(trainer, None, "fit")
    assert buffer.getvalue() == ""
    assert trainer.reads == 0


def test_live_reads_metrics_only_when_refresh_is_due(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(progress_module, "monotonic", lambda: clock[0])
    console, buffer = make_console(is_terminal=True)
    bar = RichProgressBar(console=console, refresh_rate_s=0.5)
    trainer = FakeTrainer(batches=100)
    bar.on_train_epoch_start(trainer, None)
    assert trainer.reads == 1  # the first draw
    for batch_idx in range(50):
        bar.on_train_batch_end(trainer, None, None, None, batch_idx)
    assert trainer.reads == 1  # no time passed: no read, no redraw
    clock[0] += 0.5
    bar.on_train_batch_end(trainer, None, None, None, 50)
    assert trainer.reads == 2
    for batch_idx in range(51, 100):
        bar.on_train_batch_end(trainer, None, None, None, batch_idx)
    assert trainer.reads == 2
    bar.on_train_epoch_end(trainer, None)
    assert trainer.reads == 3  # the epoch end always shows the final values
    bar.teardown(trainer, None, "fit")
    out = buffer.getvalue()
    assert "Epoch 1/2" in out and "100/100" in out and "loss=0.4312" in out


def test_live_shows_sanity_validation_and_test_bars() -> None:
    console, buffer = make_console(is_terminal=True)
    bar = RichProgressBar(console=console, refresh_rate_s=0.0)
    trainer = FakeTrainer(batches=4)
    trainer.sanity_checking = True
    bar.on_sanity_check_start(trainer, None)
    run_eval(bar, trainer, 2, "validation")
    bar.on_sanity_check_end(trainer, None)
    trainer.sanity_checking = False
    run_epoch(bar, trainer, val_batches=3)
    bar.teardown(trainer, None, "fit")
    trainer.state = types.SimpleNamespace(stage="test")
    run_eval(bar, trainer, 8, "test")
    bar.teardown(trainer, None, "test")
    out = buffer.getvalue()
    for text in ("Sanity Checking", "2/2", "Validation", "Epoch 1/2", "4/4", "Testing", "8/8"):
        assert text in out


def test_exception_stops_the_live_display() -> None:
    console, _ = make_console(is_terminal=True)
    bar = RichProgressBar(console=console)
    trainer = FakeTrainer()
    bar.on_train_epoch_start(trainer, None)
    live = bar._progress.live  # the display this stage started
    assert live.is_started
    bar.on_exception(trainer, None, RuntimeError("boom"))
    assert not live.is_started
    bar.teardown(trainer, None, "fit")  # teardown after on_exception is harmless


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"refresh_rate_s": -1}, "refresh_rate_s"),
        ({"refresh_rate_s": "fast"}, "refresh_rate_s"),
        ({"plain_every_n_steps": 0}, "plain_every_n_steps"),
        ({"plain_every_n_steps": True}, "plain_every_n_steps"),
        ({"refresh_rate": -1}, "refresh_rate"),
        ({"refresh_rate": True}, "refresh_rate"),
        ({"refresh_rate": 0.5}, "refresh_rate"),
        ({"theme": "dark"}, "theme"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"{name}=.* expected .* Pass e\.g\. {name}="):
        RichProgressBar(**kwargs)


def test_console_with_console_kwargs_is_refused() -> None:
    console, _ = make_console()
    with pytest.raises(ConfigurationError, match=r"console_kwargs=.*Pass one of them"):
        RichProgressBar(console=console, console_kwargs={"width": 90})


def test_lightning_refresh_rate_redraws_every_n_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's ``refresh_rate`` counts batches: the clock does not matter."""
    clock = [1000.0]
    monkeypatch.setattr(progress_module, "monotonic", lambda: clock[0])
    console, buffer = make_console(is_terminal=True)
    bar = RichProgressBar(console=console, refresh_rate=10)
    trainer = FakeTrainer(batches=35)
    bar.on_train_epoch_start(trainer, None)
    for batch_idx in range(35):
        bar.on_train_batch_end(trainer, None, None, None, batch_idx)
    assert trainer.reads == 1 + 3  # the first draw, then after batches 10, 20 and 30
    run_eval(bar, trainer, 25, "validation")  # its batches read no metric
    assert trainer.reads == 1 + 3 + 2  # its end: its bar, and the train bar's new metrics
    bar.on_train_epoch_end(trainer, None)
    bar.teardown(trainer, None, "fit")
    assert "35/35" in buffer.getvalue()


def test_refresh_rate_zero_shows_nothing_even_after_enable() -> None:
    console, buffer = make_console(is_terminal=True)
    bar = RichProgressBar(console=console, refresh_rate=0)
    assert bar.is_disabled and not bar.is_enabled
    bar.enable()
    assert bar.is_disabled
    trainer = FakeTrainer(batches=4)
    run_epoch(bar, trainer, val_batches=2)
    bar.teardown(trainer, None, "fit")
    assert buffer.getvalue() == "" and trainer.reads == 0


def test_theme_styles_the_live_bar_and_formats_the_metrics() -> None:
    console, buffer = make_console(is_terminal=True)
    theme = RichProgressBarTheme(metrics="green", metrics_text_delimiter=" | ", description="red")
    bar = RichProgressBar(console=console, theme=theme, refresh_rate_s=0.0)
    trainer = FakeTrainer(batches=3, metrics={"loss": 0.43124, "acc": 0.5})
    run_epoch(bar, trainer)
    bar.teardown(trainer, None, "fit")
    out = buffer.getvalue()
    assert "loss: 0.431 | acc: 0.500" in out  # metrics_format ".3f", the delimiter
    assert "\x1b[32m" in out and "\x1b[31m" in out  # green metrics, red description
    assert "3/3" in out


def test_console_kwargs_build_the_console() -> None:
    bar = RichProgressBar(console_kwargs={"file": io.StringIO(), "width": 97})
    trainer = FakeTrainer(batches=2)
    run_epoch(bar, trainer)
    bar.teardown(trainer, None, "fit")
    assert bar._console.width == 97  # the bar's own console, built from the arguments


def test_importing_does_not_import_rich() -> None:
    code = (
        "import sys, trainer, trainer.callbacks.progress, trainer.callbacks.model_summary\n"
        "from trainer.callbacks import RichProgressBar, ModelSummary\n"
        "RichProgressBar(); ModelSummary()\n"
        "assert 'rich' not in sys.modules, sorted(m for m in sys.modules if 'rich' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("is_terminal", [False, True])
def test_batch_hook_costs_under_two_microseconds(is_terminal: bool) -> None:
    console, _ = make_console(is_terminal=is_terminal)
    bar = RichProgressBar(console=console, refresh_rate_s=3600, plain_every_n_steps=10**9)
    trainer = FakeTrainer(batches=10**9)
    bar.on_train_epoch_start(trainer, None)
    hook, calls = bar.on_train_batch_end, 20_000
    best = float("inf")
    for _ in range(5):  # best of 5 runs: robust to a busy machine
        start = time.perf_counter()
        for batch_idx in range(calls):
            hook(trainer, None, None, None, batch_idx)
        best = min(best, (time.perf_counter() - start) / calls)
    bar.teardown(trainer, None, "fit")
    assert best < 2e-6, f"{best * 1e9:.0f} ns per call"
    assert trainer.reads <= 1


def test_fit_prints_plain_lines(tmp_path: Path) -> None:
    from trainer import Trainer, TrainModule

    class Tiny(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("val/loss", loss, prog_bar=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    train = torch.utils.data.DataLoader(data, batch_size=4)  # 10 batches
    val = torch.utils.data.DataLoader(data, batch_size=8)  # 5 batches
    console, buffer = make_console()
    bar = RichProgressBar(console=console, plain_every_n_steps=4)
    quiet = {"logger": False, "enable_checkpointing": False, "enable_model_summary": False}
    trainer = Trainer(max_epochs=2, callbacks=[bar], default_root_dir=tmp_path, **quiet)
    trainer.fit(Tiny(), train, val)
    lines = buffer.getvalue().splitlines()
    assert heads(buffer) == EXPECTED_HEADS
    assert all(" it/s  ETA " in line for line in (lines[0], lines[1], lines[3], lines[4]))
    for end in (lines[2], lines[5]):  # epoch ends carry the validation loss and the elapsed time
        assert "  val/loss=" in end and "  elapsed " in end
