"""Tests of trainer/callbacks/tuner.py: Lightning's Tuner, a search alone before a fit.

Equality with Lightning's Tuner: tests/parity/test_lr_finder.py."""

from __future__ import annotations

import pytest
import torch

from tests.callbacks.test_batch_size_finder import MemoryLimited
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, LearningRateFinder, Tuner
from trainer.errors import ConfigurationError


class Hooks(Callback):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_fit_start(self, trainer, module):
        self.calls.append("on_fit_start")

    def on_train_start(self, trainer, module):
        self.calls.append("on_train_start")

    def on_exception(self, trainer, module, exception):
        self.calls.append("on_exception")

    def teardown(self, trainer, module, stage):
        self.calls.append("teardown")


def test_lr_find_searches_sets_the_rate_and_leaves_a_trainer_that_fits(tmp_path):
    torch.manual_seed(0)
    module, hooks = LinearModule(lr=1e-6), Hooks()
    run = quiet_trainer(tmp_path, max_epochs=2, callbacks=[hooks], enable_checkpointing=True)
    callbacks_before = list(run.callbacks)
    finder = Tuner(run).lr_find(module, make_loader(n=64, batch_size=64), num_training=30)
    assert isinstance(finder, LearningRateFinder) and len(finder.results["lr"]) == 30
    assert module.hparams.lr == finder.suggestion() == finder.suggested_lr
    # The fit ended at on_fit_start, cleanly: no training, no checkpoint, teardown ran, the
    # other callbacks' on_fit_start did not (the finder runs first and ends it).
    assert run.global_step == 0 and run.state.status == "finished"
    assert hooks.calls == ["teardown"]
    assert not (tmp_path / "checkpoints").exists()
    assert run.callbacks == callbacks_before  # the finder is gone again
    run.fit(module, make_loader(n=64, batch_size=64))
    assert run.global_step == 2 and run.optimizers[0].param_groups[0]["lr"] == module.hparams.lr
    assert hooks.calls == ["teardown", "on_fit_start", "on_train_start", "teardown"]


class Regression(LinearModule):
    """A learning rate under ``rate_name`` (an attribute), or under no name at all."""

    def __init__(self, rate_name: str | None) -> None:
        super().__init__()
        del self.hparams["lr"]
        self.rate_name = rate_name
        if rate_name is not None:
            setattr(self, rate_name, 1e-6)

    def configure_optimizers(self):
        rate = getattr(self, self.rate_name) if self.rate_name else 1e-6
        return torch.optim.SGD(self.parameters(), lr=rate)


def test_lr_find_picks_lr_or_learning_rate_as_lightning(tmp_path):
    run = quiet_trainer(tmp_path, max_epochs=1)
    module = Regression("learning_rate")
    finder = Tuner(run).lr_find(module, make_loader(n=64, batch_size=64), num_training=20)
    assert finder.attr_name == "learning_rate" and module.learning_rate == finder.suggested_lr
    with pytest.raises(ConfigurationError, match="no `lr` or `learning_rate`"):
        Tuner(run).lr_find(Regression(None), make_loader())
    found = Tuner(run).lr_find(Regression(None), make_loader(), update_attr=False, num_training=12)
    assert len(found.results["lr"]) == 12  # nothing to update: no name needed
    with pytest.raises(ConfigurationError, match=r"method='validate'"):
        Tuner(run).lr_find(LinearModule(), make_loader(), method="validate")


def test_scale_batch_size_returns_and_sets_the_size_then_the_fit_uses_it(tmp_path):
    module = MemoryLimited(limit=23)
    run = quiet_trainer(tmp_path, max_epochs=1)
    size = Tuner(run).scale_batch_size(module, mode="binsearch", steps_per_trial=1)
    assert size == int(23 * 0.95) == module.batch_size  # Lightning's 5 % margin
    assert run.global_step == 0
    module.tried.clear()
    run.fit(module)
    assert set(module.tried) <= {size, 96 % size} and run.global_step == -(-96 // size)
