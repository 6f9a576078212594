"""Tests of trainer/callbacks/timer.py: stopping by time per step or epoch, per-stage clocks,
duration parsing, and the elapsed time carried over a real checkpoint resume."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Timer
from trainer.errors import ConfigurationError

STEP_S = 0.02


class SlowModule(LinearModule):
    """Each training step takes at least STEP_S seconds."""

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_S)
        return super().training_step(batch, batch_idx)


def test_stops_at_the_first_step_past_the_duration(tmp_path):
    timer = Timer(duration=dt.timedelta(seconds=0.1), verbose=False)
    run = quiet_trainer(tmp_path, max_epochs=100, callbacks=[timer])
    run.fit(SlowModule(), make_loader(32, 4))  # 8 batches per epoch
    # every step takes >= 0.02 s, so at most 5 steps fit in 0.1 s
    assert 1 <= run.global_step <= 5
    assert run.current_epoch == 0  # stopped inside the first epoch
    assert timer.time_elapsed("train") >= 0.1
    assert timer.time_remaining("train") <= 0


def test_interval_epoch_checks_at_epoch_ends_only(tmp_path, capsys):
    timer = Timer(duration=dt.timedelta(seconds=0.05), interval="epoch")
    run = quiet_trainer(tmp_path, max_epochs=100, callbacks=[timer])
    run.fit(SlowModule(), make_loader(16, 4))  # 4 batches: >= 0.08 s per epoch
    assert (run.current_epoch, run.global_step) == (1, 4)
    assert "Timer: time limit reached" in capsys.readouterr().out


def test_each_stage_has_its_own_clock(tmp_path):
    timer = Timer()
    run = quiet_trainer(tmp_path, max_epochs=1, callbacks=[timer])
    module = SlowModule()
    assert timer.time_elapsed("validate") == 0.0 and timer.start_time("validate") is None
    run.fit(module, make_loader(8, 4), make_loader(8, 4))
    train, validate = timer.time_elapsed("train"), timer.time_elapsed("validate")
    assert train >= 2 * STEP_S > validate > 0  # training includes its validation
    assert timer.end_time("train") >= timer.start_time("train")
    assert timer.time_elapsed("train") == train  # ended: the clock no longer moves
    assert timer.time_elapsed("test") == 0.0
    run.test(module, make_loader(8, 4))
    assert timer.time_elapsed("test") > 0
    assert timer.time_remaining() is None  # no duration: measure only
    assert set(timer.state_dict()["time_elapsed"]) == {"train", "validate", "test", "predict"}


def test_resumed_run_counts_the_time_already_spent(tmp_path):
    first = Timer()
    run = quiet_trainer(tmp_path, max_epochs=1, callbacks=[first])
    run.fit(SlowModule(), make_loader(16, 4))
    spent = first.time_elapsed("train")
    assert spent >= 4 * STEP_S
    run.save_checkpoint(tmp_path / "ckpt")

    # Less time allowed than already spent: stops before any new step.
    out_of_time = Timer(duration=dt.timedelta(seconds=spent / 2), verbose=False)
    resumed = quiet_trainer(tmp_path, max_epochs=3, callbacks=[out_of_time])
    resumed.fit(SlowModule(), make_loader(16, 4), ckpt_path=str(tmp_path / "ckpt"))
    assert resumed.global_step == 4

    carried = Timer()
    resumed = quiet_trainer(tmp_path, max_epochs=2, callbacks=[carried])
    resumed.fit(SlowModule(), make_loader(16, 4), ckpt_path=str(tmp_path / "ckpt"))
    assert resumed.global_step == 8
    assert carried.time_elapsed("train") >= spent + 4 * STEP_S


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("00:00:01:30", 90.0),
        ("01:02:00:00", 93600.0),
        (dt.timedelta(minutes=2), 120.0),
        ({"hours": 1, "minutes": 1}, 3660.0),
        (None, None),
    ],
)
def test_duration_forms(duration, seconds):
    assert Timer(duration=duration).duration == seconds


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"duration": "1:30"}, "DD:HH:MM:SS"),
        ({"duration": {"weeks": 1, "fortnights": 2}}, "timedelta fields"),
        ({"duration": 90}, "duration=90 (type int)"),
        ({"interval": "batch"}, "interval='batch'"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(kwargs, fragment):
    with pytest.raises(ConfigurationError, match="Timer") as info:
        Timer(**kwargs)
    assert fragment in str(info.value)


def test_unknown_stage():
    with pytest.raises(ConfigurationError, match="stage='fit'.*'train'"):
        Timer().time_elapsed("fit")
