"""Tests of trainer/callbacks/spike.py: a module whose loss spikes at a known batch; "raise" names
the step, "skip" gives the same weights as a run where that step never moved them (optimizer
state included), accumulation windows, non-finite losses, "warn", state and arguments."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, LossSpikeError, SpikeDetection
from trainer.errors import AnomalyError, ConfigurationError, TrainerError


class SpikyModule(LinearModule):
    """Multiplies the loss of the batches numbered in ``spikes`` (1-based, over the run)."""

    def __init__(self, spikes=(), factor=1000.0, optimizer="sgd", momentum=0.0):
        super().__init__(lr=0.02)
        self.spikes, self.factor = set(spikes), factor
        self.optimizer_name, self.momentum = optimizer, momentum
        self.calls = 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        return loss * self.factor if self.calls in self.spikes else loss

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=0.01)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.momentum)


def fit(tmp_path, module, callbacks=(), epochs=2, **kwargs):
    torch.manual_seed(0)
    module.net.reset_parameters()
    run = quiet_trainer(tmp_path, max_epochs=epochs, callbacks=list(callbacks), **kwargs)
    run.fit(module, make_loader(32, 4))  # 8 batches per epoch
    return run


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def test_no_spike_in_ordinary_training(tmp_path):
    detector = SpikeDetection(mode="raise")
    fit(tmp_path, SpikyModule(), [detector], epochs=3)
    assert detector.spikes == []


def test_raise_names_the_step_and_the_values(tmp_path):
    detector = SpikeDetection(mode="raise", window=5, warmup=5)
    with pytest.raises(LossSpikeError) as info:
        fit(tmp_path, SpikyModule(spikes={12}), [detector])
    message = str(info.value)
    assert "step 12 (epoch 1, batch 3)" in message
    assert f"{detector.spikes[0]['loss']:.6g} against a mean of" in message
    assert "mode='skip'" in message  # the fix
    assert isinstance(info.value, AnomalyError) and isinstance(info.value, TrainerError)
    assert detector.spikes[0]["loss"] > 100 * detector.spikes[0]["mean"]


def test_skip_gives_the_weights_of_a_run_without_that_step(tmp_path):
    detector = SpikeDetection(mode="skip")
    skipped = SpikyModule(spikes={12})
    fit(tmp_path, skipped, [detector])
    # Reference: the same batch with a zero loss, so plain SGD does not move the weights.
    reference = SpikyModule(spikes={12}, factor=0.0)
    fit(tmp_path, reference)
    for a, b in zip(params(skipped), params(reference)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [(s["epoch"], s["batch_idx"], s["step"]) for s in detector.spikes] == [(1, 3, 12)]


def test_an_exclude_batches_path_lists_every_spike_in_our_modes_too(tmp_path):
    """Not only Lightning's modes: given a path, each spike's batch and the one before it."""
    import json

    path = tmp_path / "excluded" / "bad.json"
    detector = SpikeDetection(mode="skip", exclude_batches_path=path)
    fit(tmp_path, SpikyModule(spikes={6, 12}), [detector])
    assert json.loads(path.read_text()) == [4, 5, 2, 3]  # (epoch 0, batch 5), (epoch 1, batch 3)
    assert detector.bad_batches == [4, 5, 2, 3]
    assert [(s["epoch"], s["batch_idx"]) for s in detector.spikes] == [(0, 5), (1, 3)]
    assert not SpikeDetection().exclude_batches_path  # none written without a path


class StateAtBatchEnd(Callback):
    """Compares weights and optimizer state after the spiking batch with those before it."""

    def __init__(self, batch_number):
        self.batch_number, self.calls, self.checked = batch_number, 0, False

    def snapshot(self, trainer, module):
        optimizer = trainer.optimizers[0]
        moments = [optimizer.state[p]["momentum_buffer"].clone() for p in module.parameters()]
        return params(module), moments

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.calls += 1
        if self.calls == self.batch_number:
            self.before = self.snapshot(trainer, module)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.calls == self.batch_number:
            after = self.snapshot(trainer, module)
            for a, b in zip(self.before[0] + self.before[1], after[0] + after[1]):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            self.checked = True


def test_skip_restores_the_optimizer_state(tmp_path):
    checker = StateAtBatchEnd(batch_number=12)
    detector = SpikeDetection(mode="skip")
    module = SpikyModule(spikes={12}, momentum=0.9)
    fit(tmp_path, module, [detector, checker])  # the checker runs after the detector
    assert checker.checked
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_skip_undoes_a_whole_accumulation_window(tmp_path):
    detector = SpikeDetection(mode="skip")
    skipped = SpikyModule(spikes={11})  # the first half of the window of batches 11 and 12
    fit(tmp_path, skipped, [detector], accumulate_grad_batches=2)
    reference = SpikyModule(spikes={11, 12}, factor=0.0)
    fit(tmp_path, reference, accumulate_grad_batches=2)
    for a, b in zip(params(skipped), params(reference)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_non_finite_loss_before_any_good_step(tmp_path):
    detector = SpikeDetection(mode="skip")
    module = SpikyModule(spikes={1}, factor=math.nan, optimizer="adam")
    run = fit(tmp_path, module, [detector], epochs=1)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    optimizer = run.optimizers[0]
    # Adam's first step was undone, its state removed: 7 steps counted, not 8.
    assert int(optimizer.state[module.net.weight]["step"]) == 7
    assert math.isnan(detector.spikes[0]["loss"])


def test_finite_only_false_lets_a_nan_loss_pass(tmp_path):
    class NanValue(SpikyModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss + math.nan if self.calls == 3 else loss  # gradients stay finite

    strict = SpikeDetection(mode="raise")
    with pytest.raises(LossSpikeError, match="the training loss is nan at step 3"):
        fit(tmp_path, NanValue(), [strict], epochs=1)
    lenient = SpikeDetection(mode="raise", finite_only=False)
    fit(tmp_path, NanValue(), [lenient], epochs=1)
    assert lenient.spikes == []


def test_warn_mode_keeps_the_step(tmp_path):
    detector = SpikeDetection(mode="warn")
    module = SpikyModule(spikes={12})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, module, [detector])
    # the weights it kept are off, so later losses are reported too
    assert "spiked at step 12 (epoch 1, batch 3)" in str(caught[0].message)
    assert len(detector.spikes) == len(caught) >= 1
    reference = SpikyModule(spikes={12}, factor=0.0)
    fit(tmp_path, reference)
    assert not torch.equal(module.net.weight, reference.net.weight)


def test_tolerances():
    relative = SpikeDetection(rtol=2.0)
    assert (relative.is_spike(2.9, 1.0), relative.is_spike(3.1, 1.0)) == (False, True)
    both = SpikeDetection(atol=5.0, rtol=2.0)
    assert (both.is_spike(4.0, 1.0), both.is_spike(6.5, 1.0)) == (False, True)
    absolute = SpikeDetection(atol=0.5, rtol=None)
    assert (absolute.is_spike(1.4, 1.0), absolute.is_spike(1.6, 1.0)) == (False, True)
    assert relative.is_spike(math.inf, 1.0) and relative.is_spike(math.nan, 1.0)
    assert not relative.is_spike(0.1, 1.0)  # lower is never a spike


def test_state_round_trip(tmp_path):
    detector = SpikeDetection(mode="skip", window=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(tmp_path, SpikyModule(spikes={12}), [detector])
    state = detector.state_dict()
    assert len(state["losses"]) == 3 and state["num_good"] == 15
    restored = SpikeDetection(mode="skip", window=3)
    restored.load_state_dict(state)
    assert restored.state_dict() == state


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"mode": "ignore"}, "mode='ignore'"),
        ({"window": 0}, "window=0"),
        ({"warmup": -1}, "warmup=-1"),
        ({"rtol": -2.0}, "rtol=-2.0"),
        ({"rtol": None}, "atol=None, rtol=None"),
    ],
)
def test_bad_arguments(kwargs, fragment):
    with pytest.raises(ConfigurationError, match="SpikeDetection") as info:
        SpikeDetection(**kwargs)
    assert fragment in str(info.value)
