"""Tests of trainer/callbacks/lambda_function.py: functions run as hooks with the hooks'
arguments in a real fit, only the given hooks exist, and bad names or values are refused."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, LambdaCallback
from trainer.errors import ConfigurationError
from trainer.trainer.hooks import CALLBACK_HOOKS


def test_functions_run_as_hooks_with_the_hook_arguments(tmp_path):
    calls: list[tuple] = []
    callback = LambdaCallback(
        setup=lambda trainer, module, stage: calls.append(("setup", stage)),
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: calls.append(
            ("batch", trainer.global_step, batch_idx, isinstance(outputs["loss"], torch.Tensor))
        ),
        on_train_epoch_end=lambda trainer, module: calls.append(("epoch", trainer.current_epoch)),
        on_fit_end=lambda trainer, module: calls.append(("fit_end", type(module).__name__)),
        teardown=None,  # ignored, as in Lightning
    )
    run = quiet_trainer(tmp_path, max_epochs=2, callbacks=[callback])
    run.fit(LinearModule(), make_loader(8, 4))  # 2 batches per epoch
    assert calls == [
        ("setup", "fit"),
        ("batch", 1, 0, True),
        ("batch", 2, 1, True),
        ("epoch", 0),
        ("batch", 3, 0, True),
        ("batch", 4, 1, True),
        ("epoch", 1),
        ("fit_end", "LinearModule"),
    ]


def test_only_the_given_hooks_are_overridden():
    callback = LambdaCallback(on_fit_end=print)
    assert isinstance(callback, LambdaCallback) and isinstance(callback, Callback)
    assert type(callback).on_fit_end is print
    assert type(callback).on_train_batch_end is Callback.on_train_batch_end
    other = LambdaCallback(on_train_batch_end=print)
    assert type(other).on_fit_end is Callback.on_fit_end  # instances do not share hooks
    assert type(callback).__qualname__ == "LambdaCallback" == callback.state_key
    assert repr(other) == "LambdaCallback(on_train_batch_end=...)"


def test_runs_before_the_module_and_in_list_order(tmp_path):
    order: list[str] = []

    class Module(LinearModule):
        def on_train_start(self):
            order.append("module")

    first = LambdaCallback(on_train_start=lambda trainer, module: order.append("first"))
    second = LambdaCallback(on_train_start=lambda trainer, module: order.append("second"))
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[first, second]).fit(
        Module(), make_loader(4, 4)
    )
    assert order == ["first", "second", "module"]  # Lightning 2.6: callbacks, then the module


def test_unknown_hook_lists_the_valid_ones():
    with pytest.raises(ConfigurationError) as info:
        LambdaCallback(on_epoch_end=print, on_train_batch_end=print)
    message = str(info.value)
    assert "LambdaCallback(on_epoch_end=...): not a hook name" in message
    assert all(hook in message for hook in CALLBACK_HOOKS)


def test_value_must_be_callable():
    with pytest.raises(ConfigurationError, match=r"on_fit_end=3 \(type int\).*expected a function"):
        LambdaCallback(on_fit_end=3)
