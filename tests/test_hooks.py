"""Pins the hook order of DESIGN §3 (Lightning 2.6's) for fit, with and without accumulation,
validate, test and predict; tests/parity/test_hook_order.py checks it against Lightning itself."""

from __future__ import annotations

import pytest

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback
from trainer.trainer.hooks import (
    CALLBACK_HOOKS,
    CALLBACK_ONLY_HOOKS,
    FIT_ORDER,
    Block,
    eval_sequence,
    fit_sequence,
)

_RECORDED_STEPS = (
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
    "configure_optimizers",
    "configure_model",
)


class RecordingModule(LinearModule):
    """Records every hook and step it receives."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def configure_model(self):
        self.calls.append("configure_model")

    def configure_optimizers(self):
        self.calls.append("configure_optimizers")
        return super().configure_optimizers()

    def training_step(self, batch, batch_idx):
        self.calls.append("training_step")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.calls.append("validation_step")
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self.calls.append("test_step")
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        self.calls.append("predict_step")
        return super().predict_step(batch, batch_idx)


def _recorder(name: str, tag: str):
    def hook(self, *args):
        self.calls.append(f"{tag}{name}")

    return hook


for _name in CALLBACK_HOOKS:
    if _name not in CALLBACK_ONLY_HOOKS:
        setattr(RecordingModule, _name, _recorder(_name, ""))


class RecordingCallback(Callback):
    def __init__(self, calls: list[str], tag: str) -> None:
        self.calls = calls
        self.tag = tag


for _name in CALLBACK_HOOKS:
    setattr(
        RecordingCallback,
        _name,
        (lambda name: lambda self, trainer, module, *args: self.calls.append(f"{self.tag}{name}"))(
            _name
        ),
    )


def _callbacks_then_module(sequence: list[str]) -> list[str]:
    """Expand a hook sequence: each hook runs on cb1, then cb2, then the module (Lightning 2.6);
    steps and configure_* run on the module only, sanity-check hooks on the callbacks only."""
    out = []
    for name in sequence:
        if name not in _RECORDED_STEPS:
            out += [f"cb1:{name}", f"cb2:{name}"]
        if name not in CALLBACK_ONLY_HOOKS:
            out.append(name)
    return out


def _run_fit(tmp_path, *, accumulate: int, sanity: int) -> list[str]:
    calls: list[str] = []
    module = RecordingModule(calls)
    callbacks = [RecordingCallback(calls, "cb1:"), RecordingCallback(calls, "cb2:")]
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=2,
        callbacks=callbacks,
        accumulate_grad_batches=accumulate,
        num_sanity_val_steps=sanity,
    )
    trainer.fit(module, make_loader(n=12, batch_size=4), make_loader(n=8, batch_size=4))
    return calls


def test_fit_order_matches_published_sequence(tmp_path):
    calls = _run_fit(tmp_path, accumulate=1, sanity=1)
    expected = fit_sequence(epochs=2, train_batches=3, val_batches=2, sanity_batches=1)
    assert calls == _callbacks_then_module(expected)


def test_fit_order_with_accumulation_steps_only_on_stepping_batches(tmp_path):
    calls = _run_fit(tmp_path, accumulate=2, sanity=0)
    expected = fit_sequence(epochs=2, train_batches=3, val_batches=2, accumulate_grad_batches=2)
    assert calls == _callbacks_then_module(expected)
    # 3 batches with accumulation 2: batch 1 and the last batch (3) step -> 2 optimizer steps per
    # epoch; gradients are cleared on the first batch of each window (batches 0 and 2).
    assert calls.count("on_before_optimizer_step") == 4
    assert calls.count("on_before_zero_grad") == 4
    assert calls.count("training_step") == 6


def test_fit_order_literal_for_one_batch():
    """An independent, hand-written pin of the contract (not derived from trainer.trainer.hooks)."""
    assert fit_sequence(epochs=1, train_batches=1, val_batches=1, sanity_batches=1) == [
        "setup", "configure_model", "configure_optimizers", "on_fit_start",
        "on_sanity_check_start",
        "on_validation_start", "on_validation_epoch_start",
        "on_validation_batch_start", "validation_step", "on_validation_batch_end",
        "on_validation_epoch_end", "on_validation_end",
        "on_sanity_check_end", "on_train_start",
        "on_train_epoch_start",
        "on_train_batch_start", "training_step", "on_before_zero_grad", "on_before_backward",
        "on_after_backward", "on_before_optimizer_step", "on_train_batch_end",
        "on_validation_start", "on_validation_epoch_start",
        "on_validation_batch_start", "validation_step", "on_validation_batch_end",
        "on_validation_epoch_end", "on_validation_end",
        "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown",
    ]  # fmt: skip


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_eval_stage_order(tmp_path, stage):
    calls: list[str] = []
    module = RecordingModule(calls)
    trainer = quiet_trainer(
        tmp_path, callbacks=[RecordingCallback(calls, "cb1:"), RecordingCallback(calls, "cb2:")]
    )
    getattr(trainer, stage)(module, make_loader(n=8, batch_size=4))
    step_stage = {"validate": "validation", "test": "test", "predict": "predict"}[stage]
    expected = ["setup", "configure_model", *eval_sequence(step_stage, 2), "teardown"]
    assert calls == _callbacks_then_module(expected)


def test_exception_calls_on_exception_then_teardown_and_reraises_unchanged(tmp_path):
    calls: list[str] = []

    class Boom(RecordingModule):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise KeyError("user bug")
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[RecordingCallback(calls, "cb1:")])
    with pytest.raises(KeyError, match="user bug"):
        trainer.fit(Boom(calls), make_loader(n=12, batch_size=4))
    tail = calls[calls.index("cb1:on_exception") :]
    assert tail == ["cb1:on_exception"]  # Lightning 2.6: no teardown hooks after an exception
    assert "on_train_end" not in calls and "on_fit_end" not in calls
    assert trainer.state.status == "failed"


def test_on_train_batch_start_minus_one_ends_the_epoch(tmp_path):
    class Skipper(LinearModule):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if batch_idx == 1 else None

    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(Skipper(), make_loader(n=16, batch_size=4))
    assert trainer.global_step == 2  # one batch per epoch


def test_fit_order_data_mentions_every_callback_hook_of_fit():
    names: set[str] = set()

    def walk(items):
        for item in items:
            if isinstance(item, Block):
                walk(item.hooks)
            else:
                names.add(item)

    walk(FIT_ORDER)
    fit_hooks = {h for h in CALLBACK_HOOKS if not h.startswith(("on_test", "on_predict"))}
    fit_hooks -= {"on_save_checkpoint", "on_load_checkpoint", "on_exception"}
    assert fit_hooks <= names


def test_hooks_assigned_on_instances_are_called(tmp_path):
    """As in Lightning: ``module.on_train_start = fn`` and ``callback.on_fit_end = fn`` run."""
    calls: list[str] = []
    module = LinearModule()
    module.on_train_start = lambda: calls.append("module:on_train_start")
    callback = Callback()
    callback.on_fit_end = lambda trainer, module: calls.append("callback:on_fit_end")
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(module, make_loader(n=4))
    assert calls == ["module:on_train_start", "callback:on_fit_end"]


def test_gradients_stay_after_the_step_until_the_next_window_clears_them(tmp_path):
    seen: list[tuple[str, int, bool]] = []

    class Probe(Callback):
        def on_before_zero_grad(self, trainer, module, optimizer):
            seen.append(("zero_grad", trainer.global_step, module.net.weight.grad is not None))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(("batch_end", trainer.global_step, module.net.weight.grad is not None))

    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[Probe()], accumulate_grad_batches=2)
    trainer.fit(LinearModule(), make_loader(n=16, batch_size=4))
    assert seen == [
        ("zero_grad", 0, False),  # nothing to clear before the first backward
        ("batch_end", 0, True),
        ("batch_end", 1, True),  # stepped, gradients kept
        ("zero_grad", 1, True),  # cleared here, at the next window's first batch
        ("batch_end", 1, True),
        ("batch_end", 2, True),
    ]


def test_module_callback_only_hooks_warn_and_are_not_called(tmp_path):
    calls: list[str] = []

    class WithCallbackHooks(LinearModule):
        def on_exception(self, exception):
            calls.append("on_exception")

        def on_sanity_check_start(self):
            calls.append("on_sanity_check_start")

    class Boom(WithCallbackHooks):
        def training_step(self, batch, batch_idx):
            raise KeyError("user bug")

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match="on_exception is a Callback hook"):
        with pytest.raises(KeyError):
            trainer.fit(Boom(), make_loader(n=4), make_loader(n=4))
    assert calls == []
