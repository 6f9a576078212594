"""Pins the hook order of DESIGN §3 for fit (with and without accumulation), validate, test, predict."""

from __future__ import annotations

import pytest

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback
from trainer.hooks import CALLBACK_HOOKS, FIT_ORDER, Block, eval_sequence, fit_sequence

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


def _module_then_callbacks(sequence: list[str]) -> list[str]:
    """Expand a module-level sequence: each hook (not steps) runs on module, then cb1, then cb2."""
    out = []
    for name in sequence:
        out.append(name)
        if name not in _RECORDED_STEPS:
            out += [f"cb1:{name}", f"cb2:{name}"]
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
    assert calls == _module_then_callbacks(expected)


def test_fit_order_with_accumulation_steps_only_on_stepping_batches(tmp_path):
    calls = _run_fit(tmp_path, accumulate=2, sanity=0)
    expected = fit_sequence(epochs=2, train_batches=3, val_batches=2, accumulate_grad_batches=2)
    assert calls == _module_then_callbacks(expected)
    # 3 batches with accumulation 2: batch 1 and the last batch (3) step -> 2 optimizer steps per epoch.
    assert calls.count("on_before_optimizer_step") == 4
    assert calls.count("training_step") == 6


def test_fit_order_literal_for_one_batch():
    """An independent, hand-written pin of the contract (not derived from trainer.hooks)."""
    assert fit_sequence(epochs=1, train_batches=1, val_batches=1, sanity_batches=1) == [
        "setup", "configure_model", "configure_optimizers", "on_fit_start",
        "on_sanity_check_start",
        "on_validation_start", "on_validation_epoch_start",
        "on_validation_batch_start", "validation_step", "on_validation_batch_end",
        "on_validation_epoch_end", "on_validation_end",
        "on_sanity_check_end", "on_train_start",
        "on_train_epoch_start",
        "on_train_batch_start", "training_step", "on_before_backward", "on_after_backward",
        "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end",
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
    assert calls == _module_then_callbacks(expected)


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
    tail = calls[calls.index("on_exception") :]
    assert tail == ["on_exception", "cb1:on_exception", "teardown", "cb1:teardown"]
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
