"""ModuleHooks: Lightning hooks this Trainer does not call are reported, not silently skipped;
``optimizer_step`` / ``optimizer_zero_grad`` are called (their parity with Lightning:
tests/parity/test_optimizer_hooks.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback
from trainer.trainer.module_hooks import LIGHTNING_HOOKS_NOT_CALLED


class PortedFromLightning(LinearModule):
    """A module as ported from an old Lightning, still overriding a hook nobody calls now."""

    def configure_sharded_model(self):
        raise AssertionError("never called")


def test_fit_warns_about_each_lightning_hook_the_module_defines(tmp_path):
    with pytest.warns(UserWarning) as caught:
        quiet_trainer(tmp_path, max_epochs=1).fit(PortedFromLightning(), make_loader())

    messages = [str(w.message) for w in caught if "Lightning hook" in str(w.message)]
    assert len(messages) == 1
    assert messages[0].startswith("PortedFromLightning.configure_sharded_model is a Lightning hook")
    assert "configure_model" in messages[0]
    assert caught[0].filename == __file__  # points at the user's fit call


def test_validate_warns_too(tmp_path):
    with pytest.warns(UserWarning, match="configure_sharded_model") as caught:
        quiet_trainer(tmp_path).validate(PortedFromLightning(), make_loader())

    assert {w.filename for w in caught} == {__file__}


def test_a_plain_module_gets_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet_trainer(tmp_path, max_epochs=1).fit(LinearModule(), make_loader())


def test_every_listed_hook_is_absent_from_the_module_base():
    for name in LIGHTNING_HOOKS_NOT_CALLED:
        assert not hasattr(trainer.TrainModule, name), name


class _Warmup(LinearModule):
    """Lightning's warm-up recipe: the learning rate grows over the first 4 steps."""

    def __init__(self) -> None:
        super().__init__(lr=0.1)
        self.lrs: list[float] = []

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        for group in optimizer.param_groups:
            group["lr"] = 0.1 * min(1.0, (self.trainer.global_step + 1) / 4)
        self.lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step(closure=optimizer_closure)


def test_an_overridden_optimizer_step_runs_on_every_stepping_batch(tmp_path):
    module = _Warmup()
    fit = quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2)
    fit.fit(module, make_loader(n=24))  # 6 batches: 3 optimizer steps
    assert module.lrs == pytest.approx([0.025, 0.05, 0.075])
    assert fit.global_step == 3


def test_an_optimizer_step_assigned_on_the_instance_is_called(tmp_path):
    module, seen = LinearModule(), []

    def optimizer_step(epoch, batch_idx, optimizer, optimizer_closure):
        seen.append(batch_idx)
        optimizer.step(closure=optimizer_closure)

    module.optimizer_step = optimizer_step
    quiet_trainer(tmp_path, max_epochs=1).fit(module, make_loader(n=12))
    assert seen == [0, 1, 2]


def test_a_module_without_the_hooks_keeps_the_plain_step_path(tmp_path):
    seen: list[tuple[bool, bool]] = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer_, module, outputs, batch, batch_idx):
            loop = trainer_._fit_loop
            seen.append((loop._hooked_step is None, loop._has_zero_grad_hook))

    quiet_trainer(tmp_path, max_epochs=1, callbacks=[Probe()]).fit(LinearModule(), make_loader(8))
    assert seen == [(True, False)] * 2


def test_optimizer_step_that_skips_the_closure_names_the_fix(tmp_path):
    class Forgetful(LinearModule):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            pass

    with pytest.raises(trainer.ConfigurationError) as caught:
        quiet_trainer(tmp_path, max_epochs=1).fit(Forgetful(), make_loader(8))
    message = str(caught.value)
    assert "Forgetful.optimizer_step returned without running optimizer_closure" in message
    assert "epoch 0, batch 0" in message and "optimizer.step(closure=optimizer_closure)" in message


def test_optimizer_zero_grad_receives_the_torch_optimizer_on_window_starts(tmp_path):
    calls: list[tuple[int, bool]] = []

    class KeepZeros(LinearModule):
        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            calls.append((batch_idx, type(optimizer) is torch.optim.SGD))
            optimizer.zero_grad(set_to_none=False)

    module = KeepZeros()
    quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(module, make_loader(16))
    assert calls == [(0, True), (2, True)]
    assert all(p.grad is not None for p in module.parameters())
