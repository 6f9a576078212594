"""Parity by difference: when validation runs inside ``fit``, on lightning.pytorch 2.6 and trainer.

Lightning's rule (``_should_check_val_fx``): in an epoch ``check_val_every_n_epoch`` selects,
validation runs after the batches whose index + 1 is a multiple of ``val_check_interval`` in
batches (a float: that fraction of the epoch's batches, at least 1) — counted inside the epoch,
or over the whole fit when ``check_val_every_n_epoch=None`` — and after a batch that asks to
stop (``should_stop``, once ``min_epochs`` / ``min_steps`` allow it); there is no extra
validation at the epoch's end when the interval does not divide the epoch. Each scenario
records where each validation started (epoch, global_step), the epoch ends, and the final
weights, on both frameworks; Lightning's run is the expected value.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import trainer
from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, recording_callback
from tests.parity.frameworks import regression as regression_class

# Not on_train_end: its current_epoch after a stop inside an epoch is a deliberate difference
# (docs/migration/lightning.md), compared in test_loop_features.py.
_HOOKS = ("on_validation_start", "on_train_epoch_end")


def _run(
    fw: Any,
    *,
    train: int = 20,
    stop_at: int | None = None,
    stop_in_validation: int | None = None,
    **options: Any,
) -> Any:
    calls: list[Any] = []

    class Stopping(regression_class(fw.Module)):  # type: ignore[misc]
        def on_train_batch_end(self, outputs, batch, batch_idx):
            if stop_at is not None and self.global_step == stop_at:
                self.trainer.should_stop = True

        def on_validation_end(self):  # as EarlyStopping does
            if stop_in_validation is not None and self.global_step >= stop_in_validation:
                self.trainer.should_stop = True

    recorder = recording_callback(fw.Callback, calls, _HOOKS)
    options = quiet(num_sanity_val_steps=0, **{"max_epochs": 3, **options})
    fit = fw.trainer(callbacks=[recorder], **options)
    module = Stopping()
    fit.fit(module, loader(train), loader(4, seed=1))
    weight = [round(v, 5) for v in module.net.weight.detach().flatten().tolist()]
    return calls, fit.global_step, weight


@pytest.mark.parametrize(
    "options",
    [
        {"val_check_interval": 0.3},  # 10 batches: after 3, 6 and 9; not after the 10th
        {"val_check_interval": 0.25},  # int(2.5) = 2: after 2, 4, 6, 8 and 10
        {"val_check_interval": 3},
        {"val_check_interval": 4, "accumulate_grad_batches": 3},
        {"val_check_interval": 0.3, "limit_train_batches": 7},  # int(2.1) = 2 of 7 batches
        {"val_check_interval": 0.5},
        {"val_check_interval": 3, "check_val_every_n_epoch": 2},
        {"val_check_interval": 7, "check_val_every_n_epoch": None},  # over the whole fit
        {"val_check_interval": 25, "check_val_every_n_epoch": None},  # longer than an epoch
        {"check_val_every_n_epoch": None},  # 1.0: once per epoch's worth of batches
        {"val_check_interval": 3, "max_steps": 7},  # max_steps ends the fit between checks
        {"val_check_interval": 3, "max_steps": 20},  # on an epoch's end, between checks
        {"val_check_interval": 0.3, "stop_at": 5},  # should_stop: validates at once
        # a validation inside the epoch sets should_stop: the epoch ends there, no second one
        {"val_check_interval": 3, "stop_in_validation": 4},
        {"val_check_interval": 0.5, "accumulate_grad_batches": 3, "stop_in_validation": 1},
        {"val_check_interval": 4, "accumulate_grad_batches": 3, "stop_in_validation": 1},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def test_validation_runs_where_lightning_runs_it(options: dict[str, Any]) -> None:
    expected = _run(LIGHTNING, **options)
    assert any(call[0] == "on_validation_start" for call in expected[0]), "no validation ran"
    assert _run(TRAINER, **options) == expected


def test_fraction_with_check_val_every_n_epoch_none_is_refused() -> None:
    """Lightning refuses a float interval without epochs to count it in; so does trainer."""
    with pytest.raises(Exception, match="val_check_interval"):
        LIGHTNING.trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
    with pytest.raises(trainer.ConfigurationError, match="val_check_interval=0.5"):
        TRAINER.trainer(val_check_interval=0.5, check_val_every_n_epoch=None)


def _no_validation_batches(fw: Any, tmp_path: Any) -> Any:
    """``limit_val_batches=0`` (the usual way to skip validation while debugging) with a
    checkpoint monitoring a validation metric, then ``validate`` and ``test`` with no batch."""
    calls: list[Any] = []
    hooks = ("on_sanity_check_start", "on_validation_start", "on_validation_end", "on_test_start")
    recorder = recording_callback(fw.Callback, calls, hooks)
    checkpoint = fw.callbacks.ModelCheckpoint(dirpath=str(tmp_path), monitor="val_loss")
    options = quiet(max_epochs=2, limit_val_batches=0, limit_test_batches=0)
    fit = fw.trainer(
        **{**options, "callbacks": [recorder, checkpoint], "enable_checkpointing": True}
    )

    class Tested(regression_class(fw.Module)):  # type: ignore[misc]
        def test_step(self, batch, batch_idx):
            pass

    module = Tested()
    fit.fit(module, loader(8), loader(4, seed=1))
    results = (
        fit.validate(module, loader(4), **fw.eval_options),
        fit.test(module, loader(4), **fw.eval_options),
    )
    return (
        calls,
        fit.global_step,
        results,
        [round(v, 5) for v in module.net.weight.flatten().tolist()],
    )


def test_no_validation_batch_runs_no_validation_as_in_lightning(tmp_path) -> None:
    """No sanity check and no validation hook; the monitored metric never appears, so the
    checkpoint warns (as Lightning) instead of stopping the fit; validate / test return []."""
    expected = _no_validation_batches(LIGHTNING, tmp_path / "lightning")
    assert expected[0] == [] and expected[2] == ([], [])
    assert _no_validation_batches(TRAINER, tmp_path / "trainer") == expected


def _timed(fw: Any, tmp_path: Any, **options: Any) -> Any:
    """Each training step sleeps 0.25 s; validation is due 0.6 s after training started or the
    last validation ended. A ModelCheckpoint on ``val_loss`` and an EarlyStopping (told to check
    after validations: Lightning's own default reads ``trainer.val_check_interval``, which its
    Trainer does not set for a duration) ride along."""
    calls: list[Any] = []

    class Slow(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            time.sleep(0.25)
            return super().training_step(batch, batch_idx)

    hooks = ("on_validation_start", "on_train_epoch_end")
    checkpoint = fw.callbacks.ModelCheckpoint(dirpath=str(tmp_path), monitor="val_loss")
    stopping = fw.callbacks.EarlyStopping(monitor="val_loss", check_on_train_epoch_end=False)
    callbacks = [recording_callback(fw.Callback, calls, hooks), checkpoint, stopping]
    options = quiet(num_sanity_val_steps=0, max_epochs=2, enable_checkpointing=True, **options)
    fit = fw.trainer(callbacks=callbacks, **options)
    module = Slow()
    fit.fit(module, loader(8), loader(4, seed=1))
    kept = sorted(name.removesuffix(".ckpt") for name in os.listdir(tmp_path))
    weight = [round(v, 5) for v in module.net.weight.detach().flatten().tolist()]
    return calls, kept, fit.global_step, weight


@pytest.mark.parametrize(
    "interval", [dt.timedelta(milliseconds=600), {"milliseconds": 600}], ids=["timedelta", "dict"]
)
def test_a_duration_validates_by_the_clock_as_in_lightning(tmp_path, interval: Any) -> None:
    """Lightning 2.6's time-based ``val_check_interval``. Epoch 0 (4 steps, 1 s) may not
    validate (``check_val_every_n_epoch=2``), so epoch 1 validates after its first batch (the
    clock ran out long ago) and again 3 steps later; the epoch's end is not a validation point.
    The checkpoint saves after each validation (not at the epoch's end)."""
    options = {"val_check_interval": interval, "check_val_every_n_epoch": 2}
    expected = _timed(LIGHTNING, tmp_path / "lightning", **options)
    assert expected[0] == [
        ("on_train_epoch_end", 0, 4),
        ("on_validation_start", 1, 5),
        ("on_validation_start", 1, 8),
        ("on_train_epoch_end", 1, 8),
    ]
    assert _timed(TRAINER, tmp_path / "trainer", **options) == expected


def test_duration_forms_and_refusals() -> None:
    """The forms Lightning takes; a malformed one is a ConfigurationError naming it (Lightning:
    a MisconfigurationException, or for a bad dict key a bare TypeError from timedelta)."""
    for value in ("00:00:01:30", dt.timedelta(seconds=90), {"seconds": 90}):
        fit = TRAINER.trainer(val_check_interval=value)
        assert fit.val_check_interval == dt.timedelta(seconds=90)
        assert LIGHTNING.trainer(val_check_interval=value)._val_check_time_interval == 90
    for value, fragment in (("1:30", "DD:HH:MM:SS"), ({"fortnights": 1}, "timedelta fields")):
        with pytest.raises((Exception, TypeError)):
            LIGHTNING.trainer(val_check_interval=value)
        with pytest.raises(trainer.ConfigurationError, match="val_check_interval") as info:
            TRAINER.trainer(val_check_interval=value)
        assert fragment in str(info.value)
    with pytest.raises(trainer.ConfigurationError, match="above zero"):  # Lightning takes it
        TRAINER.trainer(val_check_interval="00:00:00:00")


class _Stream(IterableDataset):
    """20 samples with no ``__len__``: the train loader's epoch length is unknown."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        for _ in range(20):
            x = torch.randn(4, generator=generator)
            yield x, x.sum(dim=0, keepdim=True)


def _streamed(fw: Any, **options: Any) -> Any:
    calls: list[Any] = []
    seen: list[Any] = []

    class Scheduled(regression_class(fw.Module)):  # type: ignore[misc]
        def configure_optimizers(self):
            seen.append(self.trainer.estimated_stepping_batches)
            return super().configure_optimizers()

    recorder = recording_callback(fw.Callback, calls, _HOOKS)
    fit = fw.trainer(callbacks=[recorder], **quiet(num_sanity_val_steps=0, **options))
    module = Scheduled()
    try:
        fit.fit(module, DataLoader(_Stream(), batch_size=2), loader(4, seed=1))
    except Exception as error:  # each framework raises its own class; the message is compared
        return "val_check_interval" in str(error), calls
    weight = [round(v, 5) for v in module.net.weight.detach().flatten().tolist()]
    return calls, seen, fit.global_step, weight


@pytest.mark.parametrize(
    "options",
    [
        {"max_steps": 7, "val_check_interval": 3},  # estimated_stepping_batches: max_steps
        {"max_epochs": 2, "limit_train_batches": 4},
        {"max_epochs": 2, "val_check_interval": 0.5},  # refused: a fraction of no length
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def test_an_iterable_train_loader_as_in_lightning(options: dict[str, Any]) -> None:
    """A train loader without length: ``estimated_stepping_batches`` is ``max_steps`` when set
    (it raised OverflowError), and a fractional ``val_check_interval`` is refused after the
    sanity check and before ``on_train_epoch_start``, as Lightning refuses it."""
    expected = _streamed(LIGHTNING, **options)
    assert _streamed(TRAINER, **options) == expected


def test_an_unbounded_iterable_fit_estimates_inf_steps() -> None:
    """No max_steps and no length: Lightning answers -1 when its loader is unsized; trainer
    answers ``inf`` (its documented "unbounded"), which no scheduler mistakes for a count."""
    assert _streamed(LIGHTNING, max_epochs=1)[1] == [-1]
    assert _streamed(TRAINER, max_epochs=1)[1] == [float("inf")]
