"""Parity by difference: the fit loop's edge cases, on lightning.pytorch 2.6 and trainer.

``training_step`` returning None on the batch that ends an accumulation window; an epoch skipped
(``on_train_batch_start`` -> -1) inside a window; ``should_stop`` set in
``on_train_epoch_start``; ``max_time`` against ``min_epochs`` / ``min_steps``; a sanity check of
every batch (``num_sanity_val_steps=-1``) under ``limit_val_batches``; fits with nothing to
train; what ``on_train_batch_end`` and ``on_before_backward`` receive. Each scenario records the
hooks (with epoch and step) and the weights on both frameworks; Lightning's run is the expected
value.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, recording_callback
from tests.parity.frameworks import regression as regression_class

_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
)


def _weights(module: Any) -> list[float]:
    return [round(v, 5) for v in module.net.weight.detach().flatten().tolist()]


# ---- training_step returning None on a window's stepping batch ------------------------------
def _none_on_stepping_batch(fw: Any, recipe: str) -> dict[str, Any]:
    calls: list[Any] = []

    class NoneAtOne(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            return None if batch_idx in (1, 4) else self.loss(batch)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            calls.append(("weights", batch_idx, self.global_step, _weights(self)))

        if recipe == "optimizer_step":

            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
                calls.append(("m:optimizer_step", batch_idx))
                optimizer.step(closure=optimizer_closure)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callbacks = [] if recipe == "plain" else [recording_callback(fw.Callback, calls, _BATCH_HOOKS)]
    clip = {"gradient_clip_val": 0.05} if recipe == "clipping" else {}
    fit = fw.trainer(callbacks=callbacks, **quiet(max_epochs=1, accumulate_grad_batches=2, **clip))
    module = NoneAtOne()
    fit.fit(module, loader(12))
    return {"calls": calls, "global_step": fit.global_step, "weights": _weights(module)}


@pytest.mark.parametrize("recipe", ["plain", "hooks", "clipping", "optimizer_step"])
def test_none_on_a_stepping_batch_steps_on_the_accumulated_gradients(recipe: str) -> None:
    """Batch 1 ends the first window: Lightning still steps (and clips) with batch 0's
    gradients; batch 4 starts a window, whose step takes batch 5's alone."""
    assert _none_on_stepping_batch(TRAINER, recipe) == _none_on_stepping_batch(LIGHTNING, recipe)


# ---- an epoch skipped inside an accumulation window -----------------------------------------
def _skip_inside_window(fw: Any) -> dict[str, Any]:
    calls: list[Any] = []

    class SkipsInsideWindow(regression_class(fw.Module)):  # type: ignore[misc]
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if (self.current_epoch, batch_idx) == (0, 2) else None

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    recorder = recording_callback(fw.Callback, calls, _BATCH_HOOKS)
    fit = fw.trainer(callbacks=[recorder], **quiet(max_epochs=2, accumulate_grad_batches=3))
    module = SkipsInsideWindow()
    fit.fit(module, loader(10))
    return {"calls": calls, "global_step": fit.global_step, "weights": _weights(module)}


def test_an_epoch_skipped_inside_a_window_leaves_the_next_epoch_fresh_windows() -> None:
    """Epoch 0 ends after 2 of 3 batches of its first window; epoch 1 steps after its batches 2
    and 4 (Lightning's windows count the epoch's batches), not after 0, 3 and 4."""
    assert _skip_inside_window(TRAINER) == _skip_inside_window(LIGHTNING)


# ---- should_stop set in on_train_epoch_start ------------------------------------------------
_EPOCH_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_validation_start")


def _stop_at_epoch_start(fw: Any, **options: Any) -> dict[str, Any]:
    calls: list[Any] = []

    class StopAtEpochOne(fw.Callback):  # type: ignore[misc, name-defined]
        def on_train_epoch_start(self, trainer_, module):
            if trainer_.current_epoch == 1:
                trainer_.should_stop = True

    recorder = recording_callback(fw.Callback, calls, (*_EPOCH_HOOKS, "on_train_batch_end"))
    fit = fw.trainer(callbacks=[StopAtEpochOne(), recorder], **quiet(max_epochs=4, **options))
    module = regression_class(fw.Module)()
    fit.fit(module, loader(8), loader(4, seed=1))
    return {"calls": calls, "global_step": fit.global_step, "weights": _weights(module)}


@pytest.mark.parametrize("options", [{}, {"min_epochs": 3}], ids=["stops", "min_epochs=3"])
def test_should_stop_in_on_train_epoch_start_ends_the_epoch_before_its_first_batch(
    options: dict[str, Any],
) -> None:
    """Epoch 1 runs on_train_epoch_start and on_train_epoch_end only: no step, no validation
    (with min_epochs=3 unmet, the stop waits and epochs 1 and 2 train in full)."""
    assert _stop_at_epoch_start(TRAINER, **options) == _stop_at_epoch_start(LIGHTNING, **options)


# ---- max_time asks to stop: min_epochs / min_steps win ---------------------------------------
def _out_of_time(fw: Any, **options: Any) -> dict[str, Any]:
    calls: list[Any] = []
    recorder = recording_callback(fw.Callback, calls, (*_EPOCH_HOOKS, "on_train_batch_end"))
    fit = fw.trainer(
        callbacks=[recorder], **quiet(max_epochs=5, max_time={"seconds": 0}, **options)
    )
    module = regression_class(fw.Module)()
    fit.fit(module, loader(6))
    facts = {"global_step": fit.global_step, "should_stop": fit.should_stop}
    return {"calls": calls, "weights": _weights(module), **facts}


@pytest.mark.parametrize(
    "options", [{"min_epochs": 2}, {"min_steps": 4}], ids=["min_epochs=2", "min_steps=4"]
)
def test_max_time_waits_for_min_epochs_and_min_steps(options: dict[str, Any]) -> None:
    """max_time=0 is up at once; as Lightning's Timer, it sets should_stop (True after the fit),
    which ends training only once the minimum is trained (min_steps=4: inside epoch 1)."""
    expected = _out_of_time(LIGHTNING, **options)
    assert expected["should_stop"] and expected["global_step"] > 0
    assert _out_of_time(TRAINER, **options) == expected


# ---- num_sanity_val_steps=-1 under limit_val_batches / overfit_batches ----------------------
def _sanity_of_all(fw: Any, **options: Any) -> list[Any]:
    seen: list[Any] = []

    class Counting(regression_class(fw.Module)):  # type: ignore[misc]
        def validation_step(self, batch, batch_idx):
            if self.trainer.sanity_checking:
                seen.append((batch_idx, list(self.trainer.num_sanity_val_batches)))
            return super().validation_step(batch, batch_idx)

    fit = fw.trainer(**quiet(max_epochs=1, num_sanity_val_steps=-1, **options))
    fit.fit(Counting(), loader(4), loader(6, seed=1))
    return seen


@pytest.mark.parametrize(
    "options", [{"limit_val_batches": 2}, {"overfit_batches": 1}], ids=["limit", "overfit"]
)
def test_a_sanity_check_of_all_batches_runs_those_validation_would(options: dict[str, Any]) -> None:
    """-1 means every batch validation runs: 2 of the 3 under limit_val_batches=2."""
    expected = _sanity_of_all(LIGHTNING, **options)
    assert len(expected) < 3
    assert _sanity_of_all(TRAINER, **options) == expected


# ---- what on_train_batch_end and on_before_backward receive ---------------------------------
def _described(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (round(float(value), 4), value.requires_grad)
    return value


def _batch_end_outputs(fw: Any, returns: str, manual: bool, **options: Any) -> list[Any]:
    seen: list[Any] = []

    class Returning(regression_class(fw.Module)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            if returns == "none":
                return None
            return {"extra": 7, "loss": loss, "aux": loss * 2} if returns == "dict" else loss

        def on_before_backward(self, loss):
            seen.append(("on_before_backward", _described(loss)))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            items = list(outputs.items()) if isinstance(outputs, dict) else [outputs]
            seen.append(("m", [(k, _described(v)) for k, v in items]))

    class Outputs(fw.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, trainer_, module, outputs, batch, batch_idx):
            seen.append(("cb", {k: _described(v) for k, v in outputs.items()}))

    fit = fw.trainer(callbacks=[Outputs()], **quiet(max_epochs=1, **options))
    fit.fit(Returning(), loader(6))
    return seen


@pytest.mark.parametrize(
    ("returns", "manual", "options"),
    [
        ("tensor", False, {}),
        ("tensor", False, {"accumulate_grad_batches": 2}),
        ("dict", False, {}),
        ("dict", False, {"accumulate_grad_batches": 2}),
        ("none", False, {"accumulate_grad_batches": 2}),
        ("tensor", True, {}),
        ("dict", True, {}),
        ("none", True, {}),
    ],
    ids=[
        "tensor",
        "tensor, accumulation",
        "dict",
        "dict, accumulation",
        "None",
        "manual tensor",
        "manual dict",
        "manual None",
    ],
)
def test_batch_end_outputs_and_the_backward_loss_are_lightnings(
    returns: str, manual: bool, options: dict[str, Any]
) -> None:
    """on_train_batch_end gets {"loss": detached loss / accumulate_grad_batches, other keys}
    ({} for None), and on_before_backward the divided loss backward takes."""
    expected = _batch_end_outputs(LIGHTNING, returns, manual, **options)
    assert _batch_end_outputs(TRAINER, returns, manual, **options) == expected


# ---- fits with nothing to train ---------------------------------------------------------------
_RUN_HOOKS = (
    "on_fit_start",
    "on_sanity_check_start",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_train_end",
    "on_fit_end",
)


def _nothing_to_train(fw: Any, case: str) -> list[Any]:
    calls: list[Any] = []

    class StopsAtFitStart(regression_class(fw.Module)):  # type: ignore[misc]
        def on_fit_start(self):
            self.trainer.should_stop = case == "should_stop_at_fit_start"

    options = {
        "max_epochs=0": {"max_epochs": 0},
        "limit_train_batches=0": {"max_epochs": 2, "limit_train_batches": 0},
        "should_stop_at_fit_start": {"max_epochs": 2},
        "second_fit": {"max_epochs": 1},
    }[case]
    run = fw.trainer(
        callbacks=[recording_callback(fw.Callback, calls, _RUN_HOOKS)],
        **quiet(num_sanity_val_steps=1, **options),
    )
    module = StopsAtFitStart()
    run.fit(module, loader(4), loader(2))
    if case == "second_fit":  # max_epochs already reached: the second fit trains nothing
        calls.append("second fit")
        run.fit(module, loader(4), loader(2))
    return [calls, run.global_step, run.current_epoch, _weights(module)]


@pytest.mark.parametrize(
    "case", ["max_epochs=0", "limit_train_batches=0", "should_stop_at_fit_start", "second_fit"]
)
def test_a_fit_with_nothing_to_train_skips_on_train_start_and_end(case: str) -> None:
    assert _nothing_to_train(TRAINER, case) == _nothing_to_train(LIGHTNING, case)


# ---- max_time is a Timer: in trainer.callbacks, and its time is saved ----------------------------
def _max_time_resumed(fw: Any, root: Any) -> dict[str, Any]:
    class Slow(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            time.sleep(0.1)
            return self.loss(batch)

    def run() -> Any:
        return fw.trainer(
            default_root_dir=str(root), **quiet(max_time={"seconds": 0.3}, max_epochs=50)
        )

    first = run()
    first.fit(Slow(), loader(8))
    first.save_checkpoint(str(root / "interrupted.ckpt"))
    second = run()
    second.fit(Slow(), loader(8), ckpt_path=str(root / "interrupted.ckpt"))
    timers = [cb for cb in second.callbacks if type(cb).__name__ == "Timer"]
    return {
        "timers": len(timers),
        "stopped_early": first.global_step < 50 * 4,
        "steps_after_resume": second.global_step - first.global_step,  # the time was spent
        "duration": timers[0]._duration if timers else None,
    }


def test_max_time_is_a_timer_whose_time_survives_a_resume(tmp_path) -> None:
    expected = _max_time_resumed(LIGHTNING, tmp_path / "lightning")
    assert expected == {
        "timers": 1, "stopped_early": True, "steps_after_resume": 0, "duration": 0.3
    }  # fmt: skip
    assert _max_time_resumed(TRAINER, tmp_path / "trainer") == expected


# ---- num_val_batches during the sanity check ----------------------------------------------------
def _counts_seen_by_validation(fw: Any) -> list[Any]:
    seen: list[Any] = []

    class Counts(fw.Callback):  # type: ignore[misc, name-defined]
        def on_validation_batch_start(self, trainer_, module, batch, batch_idx, dataloader_idx=0):
            total = trainer_.num_val_batches  # Lightning's: a list per loader; trainer's: the sum
            total = sum(total) if isinstance(total, list) else total
            seen.append((trainer_.sanity_checking, total, sum(trainer_.num_sanity_val_batches)))

    fit = fw.trainer(callbacks=[Counts()], **quiet(max_epochs=1, num_sanity_val_steps=2))
    fit.fit(regression_class(fw.Module)(), loader(4), loader(10))
    return seen


def test_num_val_batches_is_the_full_count_during_the_sanity_check() -> None:
    # trainer set it to the sanity check's count while the check ran; Lightning keeps the full
    # count there (num_sanity_val_batches has the check's).
    expected = _counts_seen_by_validation(LIGHTNING)
    assert expected[0] == (True, 5, 2)
    assert _counts_seen_by_validation(TRAINER) == expected


def _predict(self: Any, batch: Any, batch_idx: int) -> Any:
    return self.net(batch[0])


def test_predict_without_a_batch_runs_no_predict_hook_and_returns_none() -> None:
    """``limit_predict_batches=0``: Lightning runs setup and teardown only, and returns None."""
    hooks = ("setup", "teardown", "on_predict_start", "on_predict_epoch_start", "on_predict_end")

    def run(fw: Any) -> tuple[Any, list[Any]]:
        calls: list[str] = []

        def record(name: str) -> Any:
            return lambda self, *args, **kwargs: calls.append(name)

        recorder = type("Recorder", (fw.Callback,), {name: record(name) for name in hooks})()
        predicting = type("Predicting", (regression_class(fw.Module),), {"predict_step": _predict})
        module = predicting()
        fit = fw.trainer(**quiet(callbacks=[recorder], limit_predict_batches=0))
        return fit.predict(module, loader(8)), calls

    assert run(TRAINER) == run(LIGHTNING) == (None, ["setup", "teardown"])


@pytest.mark.parametrize("value", [0, 0.0])
def test_gradient_clip_val_zero_trains_without_clipping(value: float) -> None:
    """Lightning accepts 0 and clips nothing: the same weights as with no clipping at all."""

    def run(fw: Any, clip: float | None) -> list[float]:
        module = regression_class(fw.Module)()
        fw.trainer(**quiet(max_epochs=2, gradient_clip_val=clip)).fit(module, loader(8))
        return [round(float(v), 6) for v in torch.cat([p.reshape(-1) for p in module.parameters()])]

    unclipped = run(LIGHTNING, None)
    assert run(LIGHTNING, value) == unclipped
    assert run(TRAINER, value) == unclipped


@pytest.mark.parametrize("where", ["module", "callback"])
def test_an_error_in_teardown_reaches_on_exception(where: str) -> None:
    """Raised in ``teardown`` (the module's or a callback's) after a finished fit: the
    callbacks' ``on_exception`` runs and the error propagates, as in Lightning."""

    def run(fw: Any) -> list[str]:
        seen: list[str] = []

        def boom(self: Any, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("boom in teardown")

        def on_exception(self: Any, trainer_: Any, module: Any, err: BaseException) -> None:
            seen.append(f"on_exception: {err}")

        callback_methods: dict[str, Any] = {"on_exception": on_exception}
        module_class = regression_class(fw.Module)
        if where == "callback":
            callback_methods["teardown"] = boom
        else:
            module_class = type("Failing", (module_class,), {"teardown": boom})
        callback = type("Watcher", (fw.Callback,), callback_methods)()
        fit = fw.trainer(**quiet(callbacks=[callback], max_epochs=1))
        with pytest.raises(RuntimeError, match="boom in teardown"):
            fit.fit(module_class(), loader(8))
        return seen

    assert run(TRAINER) == run(LIGHTNING) == ["on_exception: boom in teardown"]
