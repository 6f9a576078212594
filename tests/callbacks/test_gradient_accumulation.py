"""Tests of trainer/callbacks/gradient_accumulation.py: the schedule, the optimizer steps it gives
in a real fit, the gradients it accumulates, and its argument checks."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, GradientAccumulationScheduler
from trainer.errors import ConfigurationError


class StepsPerEpoch(Callback):
    """Records global_step and accumulate_grad_batches at each epoch end."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.factors: list[int] = []

    def on_train_epoch_end(self, trainer, module):
        self.steps.append(trainer.global_step)
        self.factors.append(trainer.accumulate_grad_batches)


def test_schedule_lookup_fills_epoch_zero():
    scheduler = GradientAccumulationScheduler({2: 4, 1: 2})
    assert [scheduler.get_accumulate_grad_batches(e) for e in range(5)] == [1, 2, 4, 4, 4]
    assert scheduler.scheduling == {0: 1, 2: 4, 1: 2}
    assert scheduler.going_to_accumulate_grad_batches()
    assert not GradientAccumulationScheduler({0: 1}).going_to_accumulate_grad_batches()


def test_global_steps_follow_the_schedule(tmp_path):
    record = StepsPerEpoch()
    scheduler = GradientAccumulationScheduler({1: 2, 2: 3})
    run = quiet_trainer(tmp_path, max_epochs=4, callbacks=[scheduler, record])
    run.fit(LinearModule(), make_loader(32, 4))  # 8 batches per epoch
    # 8 steps, then 8/2 = 4, then ceil(8/3) = 3 (the last batch always steps), then 3 again
    assert record.steps == [8, 12, 15, 18]
    assert record.factors == [1, 2, 3, 3]
    assert run.accelerator.gradient_accumulation_steps == 3


def test_accumulated_step_equals_one_big_batch(tmp_path):
    """Epoch 0 with factor 4 on batches of 2 = one SGD step on the mean gradient of 8 samples."""
    torch.manual_seed(0)
    accumulated = LinearModule(lr=0.1)
    reference = LinearModule(lr=0.1)
    reference.load_state_dict(accumulated.state_dict())
    run = quiet_trainer(tmp_path, max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 4})])
    run.fit(accumulated, make_loader(8, 2))
    assert run.global_step == 1
    big = quiet_trainer(tmp_path, max_epochs=1)
    big.fit(reference, make_loader(8, 8))
    for a, b in zip(accumulated.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)


def test_refuses_trainer_accumulate_grad_batches(tmp_path):
    run = quiet_trainer(
        tmp_path,
        max_epochs=1,
        accumulate_grad_batches=2,
        callbacks=[GradientAccumulationScheduler({0: 4})],
    )
    with pytest.raises(ConfigurationError, match=r"accumulate_grad_batches=2.*\{0: 2\}"):
        run.fit(LinearModule(), make_loader(8, 4))


def test_refuses_manual_optimization(tmp_path):
    class Manual(LinearModule):
        automatic_optimization = False

        def training_step(self, batch, batch_idx):
            pass

    run = quiet_trainer(tmp_path, max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(ConfigurationError, match="manual optimization"):
        run.fit(Manual(), make_loader(8, 4))


@pytest.mark.parametrize(
    ("scheduling", "fragment"),
    [
        ({}, "non-empty dict"),
        ([(0, 1)], "non-empty dict"),
        ({-1: 2}, "ints >= 0; received [-1]"),
        ({"1": 2}, "ints >= 0; received ['1']"),
        ({0: 0}, "ints >= 1; received [0]"),
        ({1: 1.5}, "ints >= 1; received [1.5]"),
    ],
)
def test_bad_schedules(scheduling, fragment):
    with pytest.raises(ConfigurationError, match="GradientAccumulationScheduler") as info:
        GradientAccumulationScheduler(scheduling)
    assert fragment in str(info.value)
