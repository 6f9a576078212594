"""Tests of trainer/callbacks/weight_averaging.py: SWA and the EMA against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from torch.optim.swa_utils import SWALR

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, StochasticWeightAveraging, WeightAveraging
from trainer.checkpoint import read_checkpoint
from trainer.errors import ConfigurationError


class Recorder(Callback):
    """Keeps the weights after every step and epoch, and the learning rate of every epoch."""

    def __init__(self) -> None:
        self.step_weights: list[list[torch.Tensor]] = []
        self.epoch_weights: list[list[torch.Tensor]] = []
        self.epoch_lrs: list[float] = []

    def on_train_epoch_start(self, trainer, module):
        self.epoch_lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.step_weights.append([p.detach().clone() for p in module.parameters()])

    def on_train_epoch_end(self, trainer, module):
        self.epoch_weights.append([p.detach().clone() for p in module.parameters()])


def mean_of(snapshots: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [torch.stack(tensors).mean(0) for tensors in zip(*snapshots, strict=True)]


def assert_close(actual, expected, atol: float = 1e-6) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, atol=atol, rtol=0)


# ---- StochasticWeightAveraging -----------------------------------------------------------------
# Lightning 2.6's schedule: the weights each epoch starts from, from swa_epoch_start to the last
# epoch, are averaged; a module with BatchNorm gets one more epoch without backward.
def test_swa_final_weights_are_the_mean_of_the_epoch_start_weights(tmp_path):
    torch.manual_seed(0)
    module, recorder = LinearModule(), Recorder()
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=3, annealing_epochs=2)
    t = quiet_trainer(tmp_path, max_epochs=5, callbacks=[recorder, swa])
    t.fit(module, make_loader())
    # swa_epoch_start=3 is the third epoch (index 2): epochs 2, 3 and 4 start from the weights
    # epochs 1, 2 and 3 ended with; the last epoch's own training is not in the average.
    assert swa.swa_start == 2 and swa.n_averaged == 3
    assert_close(list(module.parameters()), mean_of(recorder.epoch_weights[1:4]))
    assert not torch.equal(module.net.weight, recorder.epoch_weights[-1][0])
    assert t.global_step == 5 * 8 and t.current_epoch == 5 and t.max_epochs == 5


def test_swa_learning_rate_follows_swalr(tmp_path):
    recorder = Recorder()
    swa = StochasticWeightAveraging(
        swa_lrs=0.01, swa_epoch_start=0.5, annealing_epochs=2, annealing_strategy="linear"
    )
    t = quiet_trainer(tmp_path, max_epochs=6, callbacks=[recorder, swa])
    t.fit(LinearModule(lr=0.05), make_loader())
    # 0.5 * 6 = 3: the third epoch (index 2) starts SWALR; the reference steps once per epoch.
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.05)
    schedule = SWALR(reference, swa_lr=0.01, anneal_epochs=2, anneal_strategy="linear")
    expected = [0.05, 0.05]
    for _ in range(4):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        schedule.step()
    assert recorder.epoch_lrs == pytest.approx(expected)
    assert expected[2:] == pytest.approx([0.05, 0.03, 0.01, 0.01])
    assert isinstance(t.lr_scheduler_configs[0].scheduler, SWALR)


class BatchNormModule(LinearModule):
    def __init__(self) -> None:
        super().__init__(lr=0.05)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1)
        )


class BackwardCounter(Callback):
    """Per epoch: backward passes, zero_grad calls and optimizer steps the fit made."""

    def __init__(self) -> None:
        self.counts: list[dict[str, int]] = []

    def on_train_epoch_start(self, trainer, module):
        self.counts.append({"backward": 0, "zero_grad": 0, "step": 0})

    def on_after_backward(self, trainer, module):
        self.counts[-1]["backward"] += 1

    def on_before_zero_grad(self, trainer, module, optimizer):
        self.counts[-1]["zero_grad"] += 1

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.counts[-1]["step"] += 1


def test_swa_recomputes_batchnorm_statistics_in_one_more_epoch_without_backward(tmp_path):
    torch.manual_seed(0)
    module, recorder, counter = BatchNormModule(), Recorder(), BackwardCounter()
    swa = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2)
    loader = make_loader(n=32, batch_size=8)
    t = quiet_trainer(tmp_path, max_epochs=3, callbacks=[recorder, counter, swa])
    t.fit(module, loader)
    # Epochs 1 and 2 start from the weights epochs 0 and 1 ended with; epoch 3 is the BatchNorm
    # epoch: the average, training_step on every batch, no backward, one counted step that
    # changes no weight.
    assert_close(list(module.parameters()), mean_of(recorder.epoch_weights[0:2]))
    assert_close(recorder.epoch_weights[3], list(module.parameters()), atol=0)
    assert t.global_step == 3 * 4 + 1 and t.current_epoch == 4 and t.max_epochs == 3
    assert counter.counts[3] == {"backward": 0, "zero_grad": 0, "step": 1}
    assert counter.counts[2] == {"backward": 4, "zero_grad": 4, "step": 4}
    assert t.accumulate_grad_batches == 1  # 4 during the BatchNorm epoch, then put back
    # The cumulative mean over the 4 batches of each batch's statistics (momentum None),
    # computed with the averaged first layer.
    with torch.no_grad():
        features = [module.net[0](x) for x, _ in loader]
    expected_mean = torch.stack([f.mean(0) for f in features]).mean(0)
    expected_var = torch.stack([f.var(0, unbiased=True) for f in features]).mean(0)
    norm = module.net[1]
    torch.testing.assert_close(norm.running_mean, expected_mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(norm.running_var, expected_var, atol=1e-6, rtol=0)
    assert int(norm.num_batches_tracked) == 4
    assert norm.momentum == 0.1  # put back after the BatchNorm epoch


def test_swa_puts_the_trainer_back_when_the_batchnorm_epoch_fails(tmp_path):
    class FailsInBatchNormEpoch(BatchNormModule):
        def training_step(self, batch, batch_idx):
            if self.trainer.current_epoch == 2 and batch_idx == 1:
                raise RuntimeError("data went away")
            return super().training_step(batch, batch_idx)

    module = FailsInBatchNormEpoch()
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[StochasticWeightAveraging(0.02)])
    with pytest.raises(RuntimeError, match="data went away"):
        t.fit(module, make_loader())
    assert t.max_epochs == 2 and t.accumulate_grad_batches == 1
    assert module.net[1].momentum == 0.1


def test_swa_resume_ends_like_an_uninterrupted_fit(tmp_path):
    def fit(root, module, ckpt_path=None, **kwargs):
        swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=2)
        t = quiet_trainer(root, max_epochs=4, callbacks=[swa], **kwargs)
        t.fit(module, make_loader(), ckpt_path=ckpt_path)
        return t, swa

    torch.manual_seed(0)
    full = LinearModule()
    fit(tmp_path / "full", full)
    torch.manual_seed(0)
    first = LinearModule()
    t, swa = fit(tmp_path / "a", first, max_steps=20)  # stops in the middle of epoch 2
    assert swa.n_averaged == 2 and t.current_epoch == 2  # the starts of epochs 1 and 2
    state = swa.state_dict()
    assert state["n_averaged"] == 2 and set(state["average"]) == {"net.weight", "net.bias"}
    t.save_checkpoint(tmp_path / "ck")
    resumed = LinearModule()
    _, swa2 = fit(tmp_path / "b", resumed, ckpt_path=tmp_path / "ck")
    assert swa2.n_averaged == 3  # epoch 2, resumed inside, is not averaged twice
    assert_close(list(resumed.parameters()), list(full.parameters()), atol=1e-7)


def test_swa_state_saved_before_epoch_start_averaging_resumes_on_the_same_epochs(tmp_path):
    """A state from before 2026-11-27 counted the epoch whose end was averaged."""
    torch.manual_seed(0)
    module = LinearModule()
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    weights = {"net.weight": torch.zeros(1, 4), "net.bias": torch.zeros(1)}
    swa.load_state_dict(
        {"n_averaged": 1, "latest_update_epoch": 0, "scheduler": None, "average": weights}
    )
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[swa])
    t.fit(module, make_loader())
    # Epoch 0's end = epoch 1's start is in the loaded average already: not folded in again.
    assert swa.n_averaged == 1
    assert_close(list(module.parameters()), [torch.zeros(1, 4), torch.zeros(1)])


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"swa_lrs": -0.1}, "swa_lrs"),
        ({"swa_lrs": 0.1, "swa_epoch_start": 1.5}, "swa_epoch_start"),
        ({"swa_lrs": 0.1, "swa_epoch_start": 0}, "swa_epoch_start"),
        ({"swa_lrs": 0.1, "annealing_epochs": -1}, "annealing_epochs"),
        ({"swa_lrs": 0.1, "annealing_strategy": "step"}, "annealing_strategy"),
        ({"swa_lrs": 0.1, "device": "nowhere"}, "device"),
    ],
)
def test_swa_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ConfigurationError, match=f"StochasticWeightAveraging\\({argument}="):
        StochasticWeightAveraging(**kwargs)


def test_swa_batchnorm_epoch_needs_no_forward(tmp_path):
    class NoForward(trainer.TrainModule):  # Lightning code often calls self.net(x) only
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    module = NoForward()
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[StochasticWeightAveraging(0.02)])
    t.fit(module, make_loader())
    assert t.global_step == 2 * 8 + 1
    assert int(module.net[1].num_batches_tracked) == 8  # the BatchNorm epoch's batches


def test_swa_with_unbounded_epochs_needs_an_int_start(tmp_path):
    t = quiet_trainer(
        tmp_path, max_epochs=-1, max_steps=3, callbacks=[StochasticWeightAveraging(0.1)]
    )
    with pytest.raises(ConfigurationError, match=r"swa_epoch_start=0.8.*max_epochs"):
        t.fit(LinearModule(), make_loader())


def test_swa_with_unbounded_epochs_ends_with_the_average(tmp_path):
    torch.manual_seed(0)
    module, recorder = LinearModule(), Recorder()
    swa = StochasticWeightAveraging(0.01, swa_epoch_start=2)
    t = quiet_trainer(tmp_path, max_epochs=-1, max_steps=20, callbacks=[recorder, swa])
    t.fit(module, make_loader())  # stops inside epoch 2; averaged: the starts of epochs 1, 2
    assert swa.n_averaged == 2
    assert_close(list(module.parameters()), mean_of(recorder.epoch_weights[0:2]))


# ---- WeightAveraging (EMA) ---------------------------------------------------------------------
def expected_ema(steps: list[list[torch.Tensor]], decay: float, every: int) -> list[torch.Tensor]:
    """The EMA of the step weights folded in after steps 1, 1 + every, ... (first: a copy)."""
    average = None
    for step, weights in enumerate(steps, start=1):
        if (step - 1) % every:
            continue
        if average is None:
            average = [w.clone() for w in weights]
        else:
            average = [decay * a + (1 - decay) * w for a, w in zip(average, weights, strict=True)]
    assert average is not None
    return average


@pytest.mark.parametrize("every", [1, 3])
def test_ema_equals_the_hand_computed_average(tmp_path, every):
    torch.manual_seed(0)
    module, recorder = LinearModule(), Recorder()
    ema = WeightAveraging(decay=0.8, update_every_n_steps=every)
    quiet_trainer(tmp_path, max_epochs=2, callbacks=[recorder, ema]).fit(module, make_loader())
    assert len(recorder.step_weights) == 16
    assert ema.n_averaged == len(range(0, 16, every))
    assert_close(list(module.parameters()), expected_ema(recorder.step_weights, 0.8, every))


def test_ema_custom_avg_fn_gives_the_plain_mean(tmp_path):
    torch.manual_seed(0)
    module, recorder = LinearModule(), Recorder()
    ema = WeightAveraging(avg_fn=lambda avg, new, n: avg + (new - avg) / (n + 1))
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[recorder, ema]).fit(module, make_loader())
    assert_close(list(module.parameters()), mean_of(recorder.step_weights))


class ValidationWeights(LinearModule):
    """Records the weight the validation runs with, and the global step it runs at."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, torch.Tensor]] = []

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.seen.append((self.global_step, self.net.weight.detach().clone()))
        return super().validation_step(batch, batch_idx)


def test_validation_sees_the_average_and_training_continues_on_the_weights(tmp_path):
    torch.manual_seed(0)
    module, recorder = ValidationWeights(), Recorder()
    plain = LinearModule()
    plain.load_state_dict(module.state_dict(), strict=False)
    ema = WeightAveraging(decay=0.5)
    t = quiet_trainer(tmp_path / "a", max_epochs=1, val_check_interval=4, callbacks=[recorder, ema])
    t.fit(module, make_loader(), make_loader(n=8))
    assert [step for step, _ in module.seen] == [4, 8]
    for step, weight in module.seen:
        expected = expected_ema(recorder.step_weights[:step], 0.5, 1)[0]
        torch.testing.assert_close(weight, expected, atol=1e-6, rtol=0)
    # The swaps leave the training trajectory untouched: the same weights as without averaging.
    plain_recorder = Recorder()
    quiet_trainer(tmp_path / "b", max_epochs=1, callbacks=[plain_recorder]).fit(
        plain, make_loader()
    )
    for ours, theirs in zip(recorder.step_weights, plain_recorder.step_weights, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_ema_resume_continues_the_same_average(tmp_path):
    def fit(root, module, ckpt_path=None, **kwargs):
        ema = WeightAveraging(decay=0.7)
        t = quiet_trainer(root, max_epochs=2, callbacks=[ema], **kwargs)
        t.fit(module, make_loader(), ckpt_path=ckpt_path)
        return t, ema

    torch.manual_seed(0)
    full = LinearModule()
    _, full_ema = fit(tmp_path / "full", full)
    torch.manual_seed(0)
    first = LinearModule()
    t, _ = fit(tmp_path / "a", first, max_steps=5)
    # After fit the module holds the average; the checkpoint's weights are the average too,
    # and the training weights travel in the callback's state.
    t.save_checkpoint(tmp_path / "ck")
    saved = read_checkpoint(tmp_path / "ck")
    assert torch.equal(saved["state_dict"]["net.weight"], first.net.weight.detach())
    state = saved["callbacks"]["WeightAveraging"]
    assert state["n_averaged"] == 5 and state["latest_update_step"] == 5
    assert not torch.equal(state["current"]["net.weight"], first.net.weight.detach())
    resumed = LinearModule()
    _, resumed_ema = fit(tmp_path / "b", resumed, ckpt_path=tmp_path / "ck")
    assert resumed_ema.n_averaged == full_ema.n_averaged == 16
    assert_close(list(resumed.parameters()), list(full.parameters()), atol=1e-7)


def test_weights_only_checkpoint_holds_the_average(tmp_path):
    torch.manual_seed(0)
    module = LinearModule()
    ema = WeightAveraging(decay=0.9)
    t = quiet_trainer(tmp_path, max_epochs=1, max_steps=3, callbacks=[ema])
    t.fit(module, make_loader())
    average = ema.averaged_tensors()["net.weight"].clone()
    t.save_checkpoint(tmp_path / "w", weights_only=True)
    weights = read_checkpoint(tmp_path / "w")["state_dict"]
    assert torch.equal(weights["net.weight"], average)
    reloaded = LinearModule()
    quiet_trainer(tmp_path).validate(reloaded, make_loader(n=8), ckpt_path=tmp_path / "w")
    assert torch.equal(reloaded.net.weight.detach(), average)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"decay": 1.5}, "decay"),
        ({"decay": "0.9"}, "decay"),
        ({"update_every_n_steps": 0}, "update_every_n_steps"),
        ({"avg_fn": 3}, "avg_fn"),
    ],
)
def test_ema_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(trainer.TrainerError, match=f"WeightAveraging\\({argument}="):
        WeightAveraging(**kwargs)
