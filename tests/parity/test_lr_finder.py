"""Parity by difference: LearningRateFinder on lightning.pytorch 2.6 and trainer.

The same module, data and finder arguments run on both frameworks; the learning rates tried, the
smoothed losses recorded, the suggestion the fit then trains with, the global step and the final
weights must agree — in exponential and linear mode, when the loss diverges and the test stops
early, with gradient accumulation and with gradient clipping. The data is large enough that
Lightning's test is not cut short by the fit's ``max_epochs``; the documented difference where
it is (Lightning stops there, trainer starts the dataloader again) is pinned last.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, LIGHTNING, TRAINER, Framework, loader, quiet

pytestmark = pytest.mark.filterwarnings("ignore")


def _module(base: type) -> Any:
    class Regression(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lr = 1e-3  # the finder writes its suggestion here
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return Regression()


def _run(framework: Framework, tmp_path, finder: dict, samples: int, **options: Any) -> dict:
    callback = framework.callbacks.LearningRateFinder(**finder)
    module = _module(framework.Module)
    run = framework.trainer(
        **quiet(max_epochs=2, default_root_dir=tmp_path / framework.name, callbacks=[callback]),
        **options,
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "not enough points"
    run.fit(module, loader(samples, batch_size=4))
    results = callback.optimal_lr.results if framework is LIGHTNING else callback.results
    return {
        "lr": [round(value, 10) for value in results["lr"]],
        "loss": [round(value, 5) for value in results["loss"]],
        "suggested": module.lr,
        "global_step": run.global_step,
        "weights": [p.detach().clone() for p in module.parameters()],
    }


SCENARIOS = {
    "exponential": ({"min_lr": 1e-4, "max_lr": 1.0, "num_training_steps": 20}, {}),
    "linear": (
        {"min_lr": 1e-3, "max_lr": 0.2, "num_training_steps": 30, "mode": "linear"},
        {},
    ),
    "diverging": ({"min_lr": 1e-3, "max_lr": 50.0, "num_training_steps": 40}, {}),
    "accumulation": (
        {"min_lr": 1e-4, "max_lr": 1.0, "num_training_steps": 20, "early_stop_threshold": None},
        {"accumulate_grad_batches": 2},
    ),
    "clipping": (
        {"min_lr": 1e-4, "max_lr": 1.0, "num_training_steps": 25},
        {"gradient_clip_val": 0.5},
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_range_test_and_its_suggestion_equal_lightnings(tmp_path, scenario):
    finder, options = SCENARIOS[scenario]
    lightning, ours = (_run(fw, tmp_path, finder, 400, **options) for fw in BOTH)
    assert ours["lr"] == lightning["lr"]
    assert ours["loss"] == pytest.approx(lightning["loss"], abs=1e-5)
    assert ours["suggested"] == pytest.approx(lightning["suggested"], rel=1e-9)
    assert ours["global_step"] == lightning["global_step"]
    for mine, theirs in zip(ours["weights"], lightning["weights"]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    if scenario == "diverging":  # the early stop is part of what was compared
        assert len(ours["loss"]) < finder["num_training_steps"]


def test_difference_a_test_longer_than_the_fit_cycles_the_dataloader(tmp_path):
    # 4 batches a epoch, max_epochs=2: Lightning's test ends with the fit's 8 batches (too few
    # points to suggest); trainer starts the dataloader again and runs all 20 steps.
    finder = {"min_lr": 1e-4, "max_lr": 1.0, "num_training_steps": 20}
    lightning, ours = (_run(fw, tmp_path, finder, 16) for fw in (LIGHTNING, TRAINER))
    assert len(lightning["lr"]) == 8 and lightning["suggested"] == 1e-3  # no suggestion: kept
    assert len(ours["lr"]) == 20 and ours["lr"][:8] == lightning["lr"][:8]
    assert ours["loss"][:8] == pytest.approx(lightning["loss"][:8], abs=1e-5)


def test_tuner_lr_find_equals_lightnings_tuner(tmp_path):
    from lightning.pytorch.tuner import Tuner as LightningTuner

    from trainer.callbacks import Tuner

    results = {}
    for framework, tuner in ((LIGHTNING, LightningTuner), (TRAINER, Tuner)):
        module = _module(framework.Module)
        run = framework.trainer(**quiet(max_epochs=2, default_root_dir=tmp_path / framework.name))
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        found = tuner(run).lr_find(
            module, train_dataloaders=loader(400, batch_size=4), num_training=30, min_lr=1e-4
        )
        step_after_search = run.global_step
        run.fit(module, loader(400, batch_size=4))
        results[framework.name] = (
            found.suggestion(),
            [round(value, 5) for value in found.results["loss"]],
            module.lr,
            step_after_search,
            run.global_step,
            [p.detach().clone() for p in module.parameters()],
        )
    *lightning, lightning_weights = results["lightning"]
    *ours, our_weights = results["trainer"]
    assert ours == lightning
    for mine, theirs in zip(our_weights, lightning_weights):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_the_default_attr_name_finds_learning_rate_as_lightnings(tmp_path):
    """``LearningRateFinder()`` on a module that stores ``self.learning_rate`` (no ``lr``):
    Lightning's default ``attr_name=""`` finds it; ours refused the fit (it looked for ``lr``)."""
    outcomes = {}
    for framework in BOTH:

        class Named(type(_module(framework.Module))):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                del self.lr
                self.learning_rate = 1e-3

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.learning_rate)

        module = Named()
        finder = framework.callbacks.LearningRateFinder(min_lr=1e-4, num_training_steps=20)
        run = framework.trainer(
            **quiet(max_epochs=2, default_root_dir=tmp_path / framework.name, callbacks=[finder])
        )
        run.fit(module, loader(400, batch_size=4))
        outcomes[framework.name] = (module.learning_rate, run.global_step)
    assert outcomes["trainer"] == pytest.approx(outcomes["lightning"], rel=1e-9)
    assert outcomes["lightning"][0] != 1e-3
