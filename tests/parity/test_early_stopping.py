"""Parity by difference: when EarlyStopping stops a fit, and what it reports, on Lightning and trainer.

Each scenario runs one module whose monitored metric follows a fixed sequence (one value per
validation, or per training epoch) with one EarlyStopping configuration, on ``lightning.pytorch``
2.6 and on trainer, and compares what a user reads after ``fit``: the step and epoch reached,
``stopped_epoch``, ``wait_count``, ``best_score``, ``stopping_reason`` and its message, and
whether ``fit`` raised (and what kind of error). No expected value is written by hand.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework, loader, quiet

NAN = float("nan")


def _module(fw: Framework, values: list[float], *, on_train_epoch: bool) -> Any:
    """Logs ``metric`` = the next value of ``values``: once per validation, or once per training
    epoch (from ``training_step``, reduced over the epoch to that value)."""

    class Scripted(fw.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)
            self.calls = 0

        def _next(self) -> float:
            value = values[min(self.calls, len(values) - 1)]
            self.calls += 1
            return value

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if on_train_epoch:
                value = values[min(self.current_epoch, len(values) - 1)]
                self.log("metric", value, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            if not on_train_epoch and batch_idx == 0:
                self.log("metric", self._next())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Scripted()


def _run(
    fw: Framework,
    values: list[float],
    stopping: dict[str, Any],
    *,
    on_train_epoch: bool = False,
    **options: Any,
) -> dict[str, Any]:
    callback = fw.callbacks.EarlyStopping(monitor="metric", **stopping)
    run = fw.trainer(**quiet(max_epochs=8, num_sanity_val_steps=0, callbacks=[callback], **options))
    facts: dict[str, Any] = {}
    try:
        run.fit(_module(fw, values, on_train_epoch=on_train_epoch), loader(8), loader(4, seed=1))
        facts["error"] = None
    except Exception as error:  # compared by kind: Lightning's RuntimeError, trainer's subclass
        facts["error"] = "RuntimeError" if isinstance(error, RuntimeError) else type(error).__name__
    best = callback.best_score
    facts.update(
        step=run.global_step,
        epoch=run.current_epoch,
        should_stop=run.should_stop,
        stopped_epoch=callback.stopped_epoch,
        wait_count=callback.wait_count,
        best_score=None if best is None else round(float(best), 6),
        best_score_type=type(best).__name__,
        reason=str(getattr(callback.stopping_reason, "value", callback.stopping_reason)),
        message=callback.stopping_reason_message,
    )
    return facts


def _assert_same(values: list[float], stopping: dict[str, Any], **options: Any) -> dict[str, Any]:
    lightning, ours = (_run(fw, values, stopping, **options) for fw in BOTH)
    assert ours == lightning
    return ours


FALLING = [5.0, 4.0, 3.0, 2.9, 2.95, 3.1, 3.2, 3.3]


@pytest.mark.parametrize(
    ("values", "stopping"),
    [
        (FALLING, {"patience": 2}),  # two validations without improvement
        (FALLING, {"patience": 0}),
        (FALLING, {"patience": 2, "min_delta": 0.2}),  # 3.0 -> 2.9 is not enough
        (FALLING, {"patience": 2, "min_delta": -0.2}),  # a negative min_delta counts as its size
        ([1.0, 2.0, 3.0, 2.5, 2.6, 2.7, 2.8, 2.9], {"mode": "max", "patience": 1}),
        (FALLING, {"stopping_threshold": 3.0}),  # stops once the metric reaches it
        (FALLING, {"divergence_threshold": 4.5, "patience": 5}),  # 5.0 is already past it
        ([5.0, 4.0, NAN, 3.0], {"patience": 3}),  # check_finite stops at NaN
        ([5.0, 4.0, NAN, 3.0, 2.0], {"patience": 3, "check_finite": False}),
        ([5.0, 4.0, math.inf, 3.0], {"patience": 3}),
        ([2.0] * 8, {"patience": 3}),  # never improves after the first
    ],
    ids=[
        "patience",
        "patience-0",
        "min-delta",
        "negative-min-delta",
        "mode-max",
        "stopping-threshold",
        "divergence-threshold",
        "nan",
        "nan-unchecked",
        "inf",
        "flat",
    ],
)
def test_when_it_stops_and_what_it_reports(values: list[float], stopping: dict[str, Any]) -> None:
    _assert_same(values, stopping)


@pytest.mark.parametrize(
    "options",
    [
        {"val_check_interval": 0.5},  # two validations an epoch: each one is checked
        {"check_val_every_n_epoch": 2},
        {"min_epochs": 5},  # asked to stop earlier, the fit goes on to min_epochs
    ],
    ids=["twice-an-epoch", "every-2-epochs", "min-epochs"],
)
def test_validation_schedules(options: dict[str, Any]) -> None:
    lightning, ours = (_run(fw, FALLING, {"patience": 1}, **options) for fw in BOTH)
    if "val_check_interval" in options:
        # Stopped after the first of the epoch's two validations: Lightning counts the cut
        # epoch as done (docs/migration/lightning.md, "current_epoch after training stops
        # inside an epoch"); everything else is the same.
        assert ours.pop("epoch") == lightning.pop("epoch") - 1
    assert ours == lightning


@pytest.mark.parametrize("check_on_train_epoch_end", [None, True])
def test_a_metric_logged_in_training(check_on_train_epoch_end: bool | None) -> None:
    # The metric is a training-epoch value: None decides where to check by where validation
    # runs (at every epoch's end here, so after it); True checks at the training epoch's end.
    stopping = {"patience": 1, "check_on_train_epoch_end": check_on_train_epoch_end}
    _assert_same(FALLING, stopping, on_train_epoch=True)


@pytest.mark.parametrize("verbose", [False, True])
@pytest.mark.parametrize("strict", [True, False])
def test_a_monitor_that_is_not_logged(strict: bool, verbose: bool) -> None:
    def run(fw: Framework) -> dict[str, Any]:
        callback = fw.callbacks.EarlyStopping(
            monitor="absent", patience=1, strict=strict, verbose=verbose
        )
        fit = fw.trainer(**quiet(max_epochs=3, num_sanity_val_steps=0, callbacks=[callback]))
        module = _module(fw, [1.0], on_train_epoch=False)
        with warnings.catch_warnings(record=True) as caught_warnings:
            warnings.simplefilter("always")
            try:
                fit.fit(module, loader(8), loader(4, seed=1))
                error = None
            except Exception as caught:
                error = (
                    "RuntimeError" if isinstance(caught, RuntimeError) else type(caught).__name__
                )
        about_absent = [w.category for w in caught_warnings if "absent" in str(w.message)]
        return {
            "error": error,
            "epoch": fit.current_epoch,
            "wait_count": callback.wait_count,
            "warnings": about_absent,
        }

    lightning, ours = (run(fw) for fw in BOTH)
    assert ours == lightning
    assert (lightning["error"] is not None) == strict
    assert lightning["warnings"] == ([RuntimeWarning] * 3 if verbose and not strict else [])
