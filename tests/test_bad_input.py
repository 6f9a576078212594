"""Bad input that used to get a bare Python error, a hang or silence (issue #21).

Each case gets a `TrainerError` or a warning, as Lightning 2.6 does; where Lightning hangs (an
iterable loader that yields nothing, with no epoch limit) the fit stops with a warning instead.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.errors import ConfigurationError

# ---- 1. constructor arguments ------------------------------------------------------------


@pytest.mark.parametrize("value", [-5, -2, 1.5, "3", True])
def test_max_steps_rejects_values_other_than_an_int_or_minus_one(tmp_path, value):
    with pytest.raises(ConfigurationError, match=r"max_steps=.*-1 for no step limit") as info:
        quiet_trainer(tmp_path, max_steps=value)
    assert f"(type {type(value).__name__})" in str(info.value)


@pytest.mark.parametrize("value", [-1, 0, 7, None])
def test_max_steps_accepts_minus_one_zero_and_positive(tmp_path, value):
    expected = -1 if value is None else value
    assert quiet_trainer(tmp_path, max_steps=value).max_steps == expected


@pytest.mark.parametrize("value", [-5, -2, 2.5, True])
def test_max_epochs_rejects_values_other_than_an_int_or_minus_one(tmp_path, value):
    with pytest.raises(ConfigurationError, match=r"max_epochs=.*-1 for no epoch limit"):
        quiet_trainer(tmp_path, max_epochs=value)


def test_max_epochs_is_checked_even_with_fast_dev_run(tmp_path):
    with pytest.raises(ConfigurationError, match="max_epochs=-5"):
        quiet_trainer(tmp_path, max_epochs=-5, fast_dev_run=True)


@pytest.mark.parametrize("value", [123, b"logs", ["logs"]])
def test_default_root_dir_must_be_a_path(tmp_path, value):
    with pytest.raises(ConfigurationError, match=r"default_root_dir=.*expected a str") as info:
        quiet_trainer(tmp_path, default_root_dir=value)
    assert f"(type {type(value).__name__})" in str(info.value)


def test_default_root_dir_accepts_a_pathlike(tmp_path):
    assert quiet_trainer(tmp_path, default_root_dir=tmp_path).default_root_dir == str(tmp_path)


# ---- 2. a train dataloader with zero batches ---------------------------------------------


def _empty_loader() -> DataLoader:
    """3 samples, batch 4, drop_last: a DataLoader of length 0."""
    return DataLoader(
        TensorDataset(torch.zeros(3, 4), torch.zeros(3, 1)), batch_size=4, drop_last=True
    )


class _Calls(LinearModule):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def on_train_epoch_start(self) -> None:
        self.calls.append("on_train_epoch_start")


def test_zero_length_train_loader_warns_and_skips_training(tmp_path):
    module = _Calls()
    t = quiet_trainer(tmp_path, max_epochs=3)
    with pytest.warns(UserWarning, match=r"train dataloader has 0 batches"):
        t.fit(module, _empty_loader())
    assert t.global_step == 0 and t.current_epoch == 0
    assert module.calls == []  # no empty epochs run (Lightning: "fit stopped: No training batches")
    assert t.state.status == "finished"


def test_zero_length_val_loader_warns(tmp_path):
    t = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match=r"validation dataloader has 0 batches"):
        t.fit(LinearModule(), make_loader(n=8), _empty_loader())
    assert t.global_step == 2


def test_limit_train_batches_zero_skips_training_without_a_warning(tmp_path, recwarn):
    module = _Calls()
    t = quiet_trainer(tmp_path, max_epochs=3, limit_train_batches=0)
    t.fit(module, make_loader(n=8))
    assert t.global_step == 0 and module.calls == []
    assert not [w for w in recwarn if "0 batches" in str(w.message)]


# ---- 3. an iterable dataloader that yields nothing ---------------------------------------


class _EmptyStream(IterableDataset):
    """Yields nothing; refuses after ``bound`` epochs so a regression fails instead of hanging."""

    def __init__(self, bound: int = 20) -> None:
        self.bound = bound
        self.epochs = 0

    def __iter__(self):
        self.epochs += 1
        if self.epochs > self.bound:
            raise RuntimeError(
                f"fit asked for epoch {self.epochs} of an empty stream: it would hang"
            )
        return iter(())


def test_empty_iterable_loader_without_epoch_limit_stops_with_a_warning(tmp_path):
    stream = _EmptyStream()
    t = quiet_trainer(tmp_path, max_epochs=-1, max_steps=5)
    with pytest.warns(UserWarning, match=r"train dataloader yielded no batches in epoch 0"):
        t.fit(LinearModule(), DataLoader(stream, batch_size=None))
    assert stream.epochs == 1 and t.global_step == 0
    assert t.state.status == "finished"


def test_empty_iterable_loader_with_default_limits_stops_after_one_epoch(tmp_path):
    stream = _EmptyStream()
    t = quiet_trainer(tmp_path, max_steps=5)  # max_epochs None -> no epoch limit
    with pytest.warns(UserWarning, match=r"yielded no batches"):
        t.fit(LinearModule(), DataLoader(stream, batch_size=None))
    assert stream.epochs == 1


# ---- 4. one key logged twice in one hook with different options --------------------------


class _LogsTwice(LinearModule):
    def __init__(self, second: dict) -> None:
        super().__init__()
        self.second = second

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("a", loss, on_step=True, on_epoch=False)
        self.log("a", loss * 2, **self.second)
        return loss


def test_same_key_twice_in_training_step_with_different_options_raises(tmp_path):
    module = _LogsTwice({"on_step": False, "on_epoch": True})
    with pytest.raises(ConfigurationError) as info:
        quiet_trainer(tmp_path, max_steps=1).fit(module, make_loader())
    message = str(info.value)
    assert "self.log('a', ...)" in message and "training_step" in message
    assert "on_step=True then on_step=False" in message
    assert "on_epoch=False then on_epoch=True" in message


def test_same_key_twice_with_different_reduce_fx_raises(tmp_path):
    module = _LogsTwice({"on_step": True, "on_epoch": False, "reduce_fx": "max"})
    with pytest.raises(ConfigurationError, match=r"reduce_fx='mean' then reduce_fx='max'"):
        quiet_trainer(tmp_path, max_steps=1).fit(module, make_loader())


def test_same_key_twice_with_the_same_resolved_options_is_allowed(tmp_path):
    module = _LogsTwice({})  # defaults in training_step resolve to on_step=True, on_epoch=False
    t = quiet_trainer(tmp_path, max_steps=2)
    t.fit(module, make_loader())
    assert "a" in t.callback_metrics


def test_same_key_in_training_step_and_epoch_end_hook_is_allowed(tmp_path):
    class StepAndEpoch(LinearModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("a", loss, on_step=True, on_epoch=False)
            return loss

        def on_train_epoch_end(self):
            self.log("a", 1.0, on_step=False, on_epoch=True)

    t = quiet_trainer(tmp_path, max_epochs=1)
    t.fit(StepAndEpoch(), make_loader())  # different hooks: Lightning keeps them apart too
    assert t.global_step == 8
