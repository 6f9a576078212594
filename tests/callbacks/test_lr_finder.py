"""Tests of trainer/callbacks/lr_finder.py: the range test, its suggestion, restore and plot."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, LearningRateFinder
from trainer.callbacks.finder_steps import run_training_steps
from trainer.errors import ConfigurationError


def full_batch_loader():
    # One batch of the whole problem: the loss curve is smooth, so the steepest descent is clear.
    return make_loader(n=64, batch_size=64)


def test_suggestion_is_inside_the_range_and_training_from_it_converges(tmp_path):
    torch.manual_seed(0)
    module = LinearModule(lr=1e-6)  # far too small to learn anything in 20 steps
    finder = LearningRateFinder(min_lr=1e-8, max_lr=1.0, num_training_steps=100)
    t = quiet_trainer(tmp_path, max_epochs=20, callbacks=[finder])
    t.fit(module, full_batch_loader())
    lr = finder.suggested_lr
    assert lr is not None and 1e-8 < lr < 1.0
    assert lr == finder.suggestion()
    assert module.hparams.lr == lr and t.optimizers[0].param_groups[0]["lr"] == lr
    assert len(finder.results["lr"]) == len(finder.results["loss"]) == 100
    assert t.global_step == 20  # the test's steps are not the fit's
    # It starts near 18 and stays there at lr=1e-6; Lightning 2.6's rule (the steepest slope
    # against lr itself) suggests a cautious rate, which still learns.
    assert float(t.callback_metrics["train/loss"]) < 15


class Snapshot(Callback):
    """At on_fit_start: optionally give the optimizer state, then record everything."""

    def __init__(self, *, warm_up: bool) -> None:
        self.warm_up = warm_up
        self.weights: dict[str, torch.Tensor] = {}
        self.optimizer: dict = {}
        self.rng = torch.empty(0)

    def on_fit_start(self, trainer, module):
        optimizer = trainer.optimizers[0]
        if self.warm_up:  # momentum buffers, so that restoring them is tested
            x, y = next(iter(make_loader(n=8, batch_size=8, seed=3)))
            torch.nn.functional.mse_loss(module(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}
        state = optimizer.state_dict()
        self.optimizer = {
            "state": {k: {n: t.clone() for n, t in s.items()} for k, s in state["state"].items()},
            "param_groups": [dict(g) for g in state["param_groups"]],
        }
        self.rng = torch.get_rng_state()


class MomentumModule(LinearModule):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def test_model_optimizer_and_rng_state_after_the_test_equal_the_state_before(tmp_path):
    torch.manual_seed(0)
    before, after = Snapshot(warm_up=True), Snapshot(warm_up=False)
    finder = LearningRateFinder(num_training_steps=30, update_attr=False)
    t = quiet_trainer(
        tmp_path, max_epochs=1, limit_train_batches=1, callbacks=[before, finder, after]
    )
    t.fit(MomentumModule(), make_loader())
    assert finder.suggested_lr is not None
    assert before.weights.keys() == after.weights.keys()
    for name in before.weights:
        assert torch.equal(before.weights[name], after.weights[name]), name
    assert before.optimizer["param_groups"] == after.optimizer["param_groups"]
    assert before.optimizer["state"].keys() == after.optimizer["state"].keys() == {0, 1}
    for key, state in before.optimizer["state"].items():
        assert torch.equal(
            state["momentum_buffer"], after.optimizer["state"][key]["momentum_buffer"]
        )
    assert torch.equal(before.rng, after.rng)


def test_plot_writes_a_png(tmp_path):
    finder = LearningRateFinder(num_training_steps=40, update_attr=False)
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1, callbacks=[finder]).fit(
        LinearModule(), full_batch_loader()
    )
    figure = finder.plot(suggest=True, path=tmp_path / "lr_find.png")
    data = (tmp_path / "lr_find.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    axes = figure.axes[0]
    assert axes.get_xscale() == "log"
    assert len(axes.lines) == 2  # the curve and the suggestion's marker


def test_diverging_loss_stops_the_test_early(tmp_path):
    finder = LearningRateFinder(min_lr=1e-4, max_lr=1e3, num_training_steps=100)
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1, callbacks=[finder]).fit(
        LinearModule(), full_batch_loader()
    )
    losses = finder.results["loss"]
    assert 10 < len(losses) < 100
    best = min(x for x in losses[:-1] if math.isfinite(x))
    assert not math.isfinite(losses[-1]) or losses[-1] > 4.0 * best


def test_linear_mode_steps_the_learning_rate_evenly(tmp_path):
    finder = LearningRateFinder(
        min_lr=0.001, max_lr=0.1, num_training_steps=12, mode="linear", early_stop_threshold=None
    )
    t = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1, callbacks=[finder])
    with pytest.warns(UserWarning, match="12 steps ran, too few finite losses"):
        t.fit(LinearModule(), make_loader())  # 8 batches: the test cycles the loader
    # Lightning 2.6's schedule: min_lr first, then (i + 1) / 12 of the way for step i >= 1.
    expected = [0.001] + [0.001 + 0.099 * (i + 1) / 12 for i in range(1, 12)]
    assert finder.results["lr"] == pytest.approx(expected)
    assert finder.results["lr"][-1] == pytest.approx(0.1)
    assert finder.suggested_lr is None  # 12 - 10 - 1 = 1 point: no slope
    assert t.optimizers[0].param_groups[0]["lr"] == 0.05  # unchanged


def test_suggestion_is_the_steepest_slope_against_the_learning_rate_itself():
    finder = LearningRateFinder(num_training_steps=50)
    lrs = [1e-5 * 10 ** (i / 10) for i in range(50)]  # 1e-5 .. ~8e-1, 10 points a decade
    # Two drops: 1.0 between points 20 and 21, 1.5 between points 40 and 41. Per decade the
    # second is steeper (the index-based rule of Lightning 1.x would take it); per unit of lr
    # the first is about 70 times steeper, and Lightning 2.6 differentiates against lr.
    losses = [3.0] * 21 + [2.0] * 20 + [0.5] * 9
    finder.results = {"lr": lrs, "loss": losses}
    assert finder.suggestion() in (lrs[20], lrs[21])
    losses[20] = math.nan  # non-finite points are dropped without shifting the index
    assert finder.suggestion() in (lrs[19], lrs[21])
    finder.results = {"lr": lrs[:12], "loss": losses[:12]}
    assert finder.suggestion() is None  # one point left after skipping 10 + 1


def test_update_attr_needs_the_attribute(tmp_path):
    class NoLr(LinearModule):
        def __init__(self):
            super().__init__()
            self.hparams.pop("lr")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[LearningRateFinder(attr_name="lr")])
    with pytest.raises(ConfigurationError, match=r"attr_name='lr'.*update_attr=False"):
        t.fit(NoLr(), make_loader())
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[LearningRateFinder()])
    with pytest.raises(ConfigurationError, match=r"no `lr` or `learning_rate`.*update_attr=False"):
        t.fit(NoLr(), make_loader())


_BATCH_HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")


class HookCounting(LinearModule):
    """Counts its batch hooks and training_step calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def training_step(self, batch, batch_idx):
        self.calls["training_step"] += 1
        return super().training_step(batch, batch_idx)

    def on_train_batch_start(self, batch, batch_idx):
        self.calls["on_train_batch_start"] += 1

    def on_before_optimizer_step(self, optimizer):
        self.calls["on_before_optimizer_step"] += 1

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.calls["on_train_batch_end"] += 1


class CallbackCounting(Callback):
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.calls["on_train_batch_start"] += 1

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.calls["on_before_optimizer_step"] += 1

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls["on_train_batch_end"] += 1


def test_the_test_runs_the_modules_batch_hooks_and_no_callbacks(tmp_path):
    # Lightning's: its finders run the fit loop with trainer.callbacks swapped out.
    module, seen = HookCounting(), CallbackCounting()
    finder = LearningRateFinder(num_training_steps=16, update_attr=False, early_stop_threshold=None)
    t = quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2, callbacks=[finder, seen])
    t.fit(module, make_loader(n=16, batch_size=4))  # 4 batches: 2 steps per pass
    assert len(finder.results["lr"]) == 16
    # 16 steps of 2 batches (the loader cycled 8 times), then the fit's 4 batches (2 steps)
    assert module.calls == {
        "training_step": 36,
        "on_train_batch_start": 36,
        "on_before_optimizer_step": 18,
        "on_train_batch_end": 36,
    }
    assert seen.calls == {
        "on_train_batch_start": 4,
        "on_before_optimizer_step": 2,
        "on_train_batch_end": 4,
    }
    assert t.global_step == 2


def test_on_train_batch_start_returning_minus_one_ends_the_pass(tmp_path):
    class SkipFromThird(HookCounting):
        def on_train_batch_start(self, batch, batch_idx):
            super().on_train_batch_start(batch, batch_idx)
            return -1 if batch_idx >= 2 else None

    module = SkipFromThird()
    finder = LearningRateFinder(num_training_steps=12, update_attr=False, early_stop_threshold=None)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[finder])
    with pytest.warns(UserWarning, match="12 steps ran"):
        t.fit(module, make_loader())  # 8 batches; each pass trains on batches 0 and 1 only
    assert len(finder.results["lr"]) == 12
    assert module.calls["training_step"] == 12 + 2  # 6 passes of 2 batches; the fit's 2
    # batch 2 of each pass returns -1; the 6th pass ends with the 12th step, after batch 1
    assert module.calls["on_train_batch_start"] == 5 * 3 + 2 + 3
    assert t.global_step == 2


def test_a_module_that_skips_every_batch_ends_the_test_without_steps(tmp_path):
    class SkipAll(LinearModule):
        def on_train_batch_start(self, batch, batch_idx):
            return -1

    finder = LearningRateFinder(num_training_steps=10, update_attr=False)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[finder])
    with pytest.warns(UserWarning, match="0 steps ran"):
        t.fit(SkipAll(), make_loader())
    assert finder.results == {"lr": [], "loss": []} and finder.suggested_lr is None


def test_the_modules_optimizer_step_and_lbfgs_closure_run_in_the_test(tmp_path):
    # Before the test's steps went through the fit's step path, an overridden optimizer_step
    # was not called during the test, and LBFGS (whose step needs a closure) failed.
    class Hooked(LinearModule):
        def __init__(self) -> None:
            super().__init__(lr=0.1)
            self.optimizer_steps = 0

        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=self.hparams.lr, max_iter=2)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            self.optimizer_steps += 1
            optimizer.step(closure=optimizer_closure)

    module = Hooked()
    finder = LearningRateFinder(min_lr=1e-4, max_lr=0.5, num_training_steps=20, update_attr=False)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[finder])
    t.fit(module, make_loader())
    assert len(finder.results["lr"]) >= 12 and math.isfinite(finder.results["loss"][0])
    assert module.optimizer_steps == len(finder.results["lr"]) + 8
    assert t.global_step == 8


class RunSteps(Callback):
    """At on_fit_start: ``num_steps`` trial steps, not undone; keeps the weights they leave."""

    def __init__(self, num_steps: int) -> None:
        self.num_steps = num_steps
        self.weights: dict[str, torch.Tensor] = {}

    def on_fit_start(self, trainer, module):
        steps = run_training_steps(trainer, trainer.train_dataloader, self.num_steps)
        assert steps == self.num_steps
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}


class WeightsAtEnd(Callback):
    def on_train_end(self, trainer, module):
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}


def test_trial_steps_train_exactly_as_the_fit_does(tmp_path):
    options = dict(accumulate_grad_batches=2, gradient_clip_val=0.05)
    torch.manual_seed(0)
    trial = RunSteps(num_steps=3)
    quiet_trainer(tmp_path, max_steps=1, callbacks=[trial], **options).fit(
        MomentumModule(), make_loader()
    )
    torch.manual_seed(0)
    fitted = WeightsAtEnd()
    t = quiet_trainer(tmp_path, max_steps=3, callbacks=[fitted], **options)
    t.fit(MomentumModule(), make_loader())
    assert t.global_step == 3
    for name, value in fitted.weights.items():
        assert torch.equal(trial.weights[name], value), name


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"min_lr": 0.0}, "min_lr"),
        ({"min_lr": 1.0, "max_lr": 0.1}, "min_lr"),
        ({"num_training_steps": 1}, "num_training_steps"),
        ({"mode": "cosine"}, "mode"),
        ({"early_stop_threshold": -1.0}, "early_stop_threshold"),
        ({"attr_name": 3}, "attr_name"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ConfigurationError, match=f"LearningRateFinder\\({argument}="):
        LearningRateFinder(**kwargs)
