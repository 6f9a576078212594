"""Tests of trainer/callbacks/early_stopping.py: patience, min_delta, modes, thresholds, NaN,
when the check runs, the missing-metric error, and state restored from a real checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import EarlyStopping
from trainer.callbacks.early_stopping import EarlyStoppingReason
from trainer.errors import CheckpointError, ConfigurationError


class ScriptedModule(LinearModule):
    """Logs ``val/score`` = ``values[current_epoch]`` in every validation batch."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = values

    def validation_step(self, batch, batch_idx):
        self.log("val/score", self.values[self.current_epoch])


def fit(tmp_path, values, stopper, *, max_epochs=None, ckpt_path=None, **trainer_kwargs):
    run = quiet_trainer(
        tmp_path, max_epochs=max_epochs or len(values), callbacks=[stopper], **trainer_kwargs
    )
    run.fit(
        ScriptedModule(values),
        make_loader(16, 4),
        make_loader(8, 4, seed=1),
        ckpt_path=ckpt_path,
    )
    return run


def test_stops_after_patience_checks_without_improvement(tmp_path):
    stopper = EarlyStopping(monitor="val/score", patience=3)
    run = fit(tmp_path, [1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1], stopper)
    # best 0.5 at epoch 1; epochs 2, 3, 4 do not improve -> stop after epoch 4
    assert run.current_epoch == 5
    assert stopper.stopped_epoch == 4
    assert stopper.wait_count == 3
    assert float(stopper.best_score) == 0.5
    assert stopper.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert "did not improve in the last 3 records" in stopper.stopping_reason_message


def test_min_delta_requires_a_large_enough_improvement(tmp_path):
    values = [1.0, 0.96, 0.92, 0.88]  # each epoch improves by 0.04
    plain = EarlyStopping(monitor="val/score", patience=2)
    assert fit(tmp_path, values, plain).current_epoch == 4
    assert plain.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    strict = EarlyStopping(monitor="val/score", patience=2, min_delta=0.1)
    run = fit(tmp_path, values, strict)
    assert (run.current_epoch, strict.stopped_epoch) == (3, 2)
    assert float(strict.best_score) == 1.0


def test_mode_max(tmp_path):
    stopper = EarlyStopping(monitor="val/score", mode="max", patience=2)
    run = fit(tmp_path, [0.1, 0.5, 0.4, 0.3, 0.2], stopper)
    assert (run.current_epoch, stopper.stopped_epoch) == (4, 3)
    assert float(stopper.best_score) == 0.5


def test_stopping_threshold(tmp_path):
    stopper = EarlyStopping(monitor="val/score", patience=10, stopping_threshold=0.3)
    run = fit(tmp_path, [1.0, 0.5, 0.25, 0.1], stopper)
    assert (run.current_epoch, stopper.stopped_epoch) == (3, 2)
    assert stopper.stopping_reason is EarlyStoppingReason.STOPPING_THRESHOLD


def test_divergence_threshold(tmp_path):
    stopper = EarlyStopping(monitor="val/score", patience=10, divergence_threshold=5.0)
    run = fit(tmp_path, [1.0, 2.0, 6.0, 0.1], stopper)
    assert (run.current_epoch, stopper.stopped_epoch) == (3, 2)
    assert stopper.stopping_reason is EarlyStoppingReason.DIVERGENCE_THRESHOLD


def test_nan_stops_with_check_finite_only(tmp_path):
    values = [1.0, math.nan, 0.5, 0.4]
    stopper = EarlyStopping(monitor="val/score", patience=3)
    run = fit(tmp_path, values, stopper)
    assert (run.current_epoch, stopper.stopped_epoch) == (2, 1)
    assert stopper.stopping_reason is EarlyStoppingReason.NON_FINITE_METRIC
    assert "not finite" in stopper.stopping_reason_message
    lenient = EarlyStopping(monitor="val/score", patience=3, check_finite=False)
    assert fit(tmp_path, values, lenient).current_epoch == 4
    assert float(lenient.best_score) == pytest.approx(0.4)


def test_checks_after_each_validation_when_it_runs_inside_the_epoch(tmp_path):
    constant = [1.0] * 8
    per_epoch = EarlyStopping(monitor="val/score", patience=3)
    assert fit(tmp_path, constant, per_epoch).current_epoch == 4  # checks at e0..e3
    # Two validations per epoch: checks e0a (best) e0b e1a e1b -> 3 without improvement.
    per_validation = EarlyStopping(monitor="val/score", patience=3)
    run = fit(tmp_path, constant, per_validation, val_check_interval=0.5)
    assert (run.current_epoch, per_validation.stopped_epoch) == (2, 1)
    forced = EarlyStopping(monitor="val/score", patience=3, check_on_train_epoch_end=True)
    run = fit(tmp_path, constant, forced, val_check_interval=0.5)
    assert (run.current_epoch, forced.stopped_epoch) == (4, 3)  # once per epoch again


def test_checks_at_train_epoch_end_without_validation(tmp_path):
    class TrainOnly(LinearModule):
        validation_step = None

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("constant", 1.0, on_step=False, on_epoch=True)
            return loss

    stopper = EarlyStopping(monitor="constant", patience=2)
    run = quiet_trainer(tmp_path, max_epochs=10, callbacks=[stopper])
    run.fit(TrainOnly(), make_loader(16, 4))
    assert (run.current_epoch, stopper.stopped_epoch) == (3, 2)


def test_missing_monitor_is_an_error_that_lists_logged_metrics(tmp_path):
    stopper = EarlyStopping(monitor="val/acc")
    with pytest.raises(ConfigurationError) as info:
        fit(tmp_path, [1.0, 0.5], stopper)
    message = str(info.value)
    assert "monitor='val/acc'" in message and "val/score" in message and "strict=False" in message
    lenient = EarlyStopping(monitor="val/acc", strict=False)
    assert fit(tmp_path, [1.0, 0.5], lenient).current_epoch == 2


def test_state_is_restored_from_a_checkpoint(tmp_path):
    values = [1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
    first = EarlyStopping(monitor="val/score", patience=3)
    run = fit(tmp_path, values, first, max_epochs=3)
    assert (first.wait_count, float(first.best_score)) == (1, 0.5)
    run.save_checkpoint(tmp_path / "ckpt")
    resumed = EarlyStopping(monitor="val/score", patience=3)
    run = fit(tmp_path, values, resumed, max_epochs=10, ckpt_path=str(tmp_path / "ckpt"))
    # Restored: best 0.5, one epoch waited; epochs 3 and 4 make three -> stop after epoch 4.
    # A fresh state would take 0.7 as best and stop after epoch 6.
    assert (resumed.stopped_epoch, run.current_epoch) == (4, 5)
    assert float(resumed.best_score) == 0.5
    assert resumed.state_dict() == {
        "wait_count": 3,
        "stopped_epoch": 4,
        "best_score": 0.5,
        "patience": 3,
        "stopping_reason": 3,  # Lightning's EarlyStoppingReason value
        "stopping_reason_message": resumed.stopping_reason_message,
    }
    assert "did not improve" in resumed.stopping_reason_message


def test_why_a_run_stopped_survives_a_checkpoint(tmp_path):
    # Lightning saves stopping_reason and its message; a resumed run forgot why it had stopped.
    stopper = EarlyStopping(monitor="val/score", patience=1)
    run = fit(tmp_path, [1.0, 2.0, 3.0], stopper)
    assert stopper.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    run.save_checkpoint(tmp_path / "ckpt")
    restored = EarlyStopping(monitor="val/score", patience=1)
    restored.load_state_dict(stopper.state_dict())
    assert restored.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert restored.stopping_reason_message == stopper.stopping_reason_message
    older = {k: v for k, v in stopper.state_dict().items() if not k.startswith("stopping")}
    restored.load_state_dict(older)  # a checkpoint written before the fields existed
    assert restored.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    # before the reasons took Lightning's values, checkpoints held their names
    restored.load_state_dict({**older, "stopping_reason": "non_finite_metric"})
    assert restored.stopping_reason is EarlyStoppingReason.NON_FINITE_METRIC


@pytest.mark.parametrize(
    "field, value",
    [
        ("stopping_reason", "bored"),
        ("stopping_reason", 7),
        ("stopping_reason", True),
        ("stopping_reason_message", 3),
    ],
)
def test_a_crafted_stopping_reason_is_refused(field, value):
    state = EarlyStopping(monitor="m").state_dict()
    with pytest.raises(CheckpointError, match=field):
        EarlyStopping(monitor="m").load_state_dict({**state, field: value})


def test_monitor_op_and_its_tables_are_lightnings(tmp_path):
    stopper = EarlyStopping(monitor="m", mode="max")
    assert stopper.monitor_op is torch.gt and EarlyStopping(monitor="m").monitor_op is torch.lt
    assert EarlyStopping.order_dict == {"min": "<", "max": ">"}

    class AtLeastAsGood(EarlyStopping):  # a subclass's table decides what "better" means
        mode_dict = {"min": torch.le, "max": torch.ge}

    equal_counts = AtLeastAsGood(monitor="val/score", patience=1)
    fit(tmp_path, [1.0, 1.0, 1.0], equal_counts)  # an equal value counts as an improvement
    assert equal_counts.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    plain = EarlyStopping(monitor="val/score", patience=1)
    fit(tmp_path, [1.0, 1.0, 1.0], plain)
    assert plain.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED


def test_state_key_names_monitor_and_mode():
    assert (
        EarlyStopping(monitor="val/loss", mode="max").state_key
        == "EarlyStopping{'monitor': 'val/loss', 'mode': 'max'}"
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"mode": "avg"}, "mode='avg'"),
        ({"patience": -1}, "patience=-1"),
        ({"min_delta": "0.1"}, "min_delta='0.1'"),
        ({"stopping_threshold": "low"}, "stopping_threshold='low'"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, fragment):
    with pytest.raises(ConfigurationError, match="EarlyStopping") as info:
        EarlyStopping(monitor="val/loss", **kwargs)
    assert fragment in str(info.value)
    assert "expected" in str(info.value)
