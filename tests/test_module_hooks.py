"""ModuleHooks: Lightning hooks this Trainer does not call are reported, not silently skipped."""

from __future__ import annotations

import warnings

import pytest

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.trainer.module_hooks import LIGHTNING_HOOKS_NOT_CALLED


class PortedFromLightning(LinearModule):
    """A module as ported from Lightning, still overriding two hooks Lightning would call."""

    def optimizer_step(self, *args, **kwargs):
        raise AssertionError("never called")

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        raise AssertionError("never called")


def test_fit_warns_about_each_lightning_hook_the_module_defines(tmp_path):
    with pytest.warns(UserWarning) as caught:
        quiet_trainer(tmp_path, max_epochs=1).fit(PortedFromLightning(), make_loader())

    messages = [str(w.message) for w in caught if "Lightning hook" in str(w.message)]
    assert len(messages) == 2
    assert messages[0].startswith("PortedFromLightning.optimizer_step is a Lightning hook")
    assert "automatic_optimization = False" in messages[0]
    assert messages[1].startswith("PortedFromLightning.transfer_batch_to_device")
    assert caught[0].filename == __file__  # points at the user's fit call


def test_validate_warns_too(tmp_path):
    with pytest.warns(UserWarning, match="transfer_batch_to_device") as caught:
        quiet_trainer(tmp_path).validate(PortedFromLightning(), make_loader())

    assert {w.filename for w in caught} == {__file__}


def test_a_plain_module_gets_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet_trainer(tmp_path, max_epochs=1).fit(LinearModule(), make_loader())


def test_every_listed_hook_is_absent_from_the_module_base():
    import trainer

    for name in LIGHTNING_HOOKS_NOT_CALLED:
        assert not hasattr(trainer.TrainModule, name), name
