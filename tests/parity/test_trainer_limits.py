"""Parity by difference: the Trainer's counting arguments, on lightning.pytorch 2.6 and trainer.

A ``limit_*_batches`` (or ``overfit_batches``) fraction that keeps less than one batch of a loader
is refused by both (trainer used to run 0 batches silently); ``accumulate_grad_batches=2.0`` (from
YAML), ``val_check_interval=0.0`` (validate after every batch), ``num_sanity_val_steps=-2`` (no
sanity check) and ``min_epochs=-1`` (no minimum) are accepted by both with the same run.
Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import trainer
from tests.parity.frameworks import BOTH, LIGHTNING, Framework, loader, quiet, regression
from trainer.trainer.limits import smallest_fraction

pl = pytest.importorskip("lightning.pytorch")
_MISCONFIGURED = pl.utilities.exceptions.MisconfigurationException


def _run(framework: Framework, call: str, **options: Any) -> Any:
    """``call`` ("fit" / "test") of a regression module: 10 train batches, 2 val / test."""
    module = regression(framework.Module)()
    module.test_step = module.validation_step
    run = framework.trainer(**quiet(max_epochs=1, **options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if call == "fit":
            run.fit(module, loader(20), loader(4))
        else:
            run.test(module, loader(4), **framework.eval_options)
    return run


@pytest.mark.parametrize(
    ("call", "options", "argument", "loader_name", "least"),
    [
        ("fit", {"limit_train_batches": 0.05}, "limit_train_batches", "train_dataloader", 0.1),
        ("fit", {"limit_val_batches": 0.3}, "limit_val_batches", "val_dataloader", 0.5),
        ("test", {"limit_test_batches": 0.3}, "limit_test_batches", "test_dataloader", 0.5),
        ("fit", {"overfit_batches": 0.05}, "overfit_batches", "train_dataloader", 0.1),
    ],
)
def test_a_fraction_below_one_batch_is_refused_as_in_lightning(
    call: str, options: dict[str, Any], argument: str, loader_name: str, least: float
) -> None:
    with pytest.raises(_MISCONFIGURED, match="< 1"):
        _run(LIGHTNING, call, **options)
    with pytest.raises(trainer.ConfigurationError) as raised:
        _run(BOTH[1], call, **options)
    message = str(raised.value)
    assert f"Trainer({argument}=" in message
    assert loader_name in message
    assert f"{argument}={least}" in message


def test_zero_still_means_none_as_in_lightning() -> None:
    seen = {}
    for framework in BOTH:
        run = _run(framework, "fit", limit_train_batches=0.0, limit_val_batches=0.0)
        seen[framework.name] = (run.global_step, dict(run.callback_metrics))
    assert seen["trainer"] == seen["lightning"] == (0, {})


def test_the_smallest_fraction_keeps_one_batch() -> None:
    assert [smallest_fraction(n) for n in (1, 2, 3, 10, 49)] == [1.0, 0.5, 0.34, 0.1, 0.021]
    assert all(int(n * smallest_fraction(n)) == 1 for n in range(1, 5000))


def _recorded(framework: Framework, **options: Any) -> tuple[Any, ...]:
    calls: list[Any] = []

    class Record(framework.Callback):  # type: ignore[misc, name-defined]
        def on_validation_start(self, trainer_, module) -> None:
            calls.append(("validation", trainer_.global_step, trainer_.sanity_checking))

        def on_train_epoch_end(self, trainer_, module) -> None:
            calls.append(("epoch_end", trainer_.current_epoch))
            if trainer_.current_epoch == 0:
                trainer_.should_stop = True  # min_epochs decides whether the fit ends here

    module = regression(framework.Module)()
    run = framework.trainer(**quiet(max_epochs=3, callbacks=[Record()], **options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(module, loader(8), loader(4))
    values = tuple(getattr(run, name) for name in ("min_epochs", "accumulate_grad_batches"))
    return run.global_step, tuple(calls), values


@pytest.mark.parametrize(
    "options",
    [
        {"accumulate_grad_batches": 2.0},
        {"val_check_interval": 0.0},
        {"num_sanity_val_steps": -2},
        {"min_epochs": -1},
        {"min_epochs": -1, "min_steps": 6},
    ],
    ids=["accumulate-2.0", "val-check-0.0", "sanity--2", "min-epochs--1", "min-epochs--1-steps"],
)
def test_arguments_lightning_accepts_run_as_in_lightning(options: dict[str, Any]) -> None:
    seen = {framework.name: _recorded(framework, **options) for framework in BOTH}
    assert seen["trainer"] == seen["lightning"]


def test_a_fractional_accumulation_is_refused() -> None:
    """Lightning steps at batch counts that are multiples of 2.5 (every 5th) and at the epoch's
    end; trainer refuses the value rather than copy that."""
    with pytest.raises(trainer.ConfigurationError, match=r"Trainer\(accumulate_grad_batches=2.5"):
        trainer.Trainer(logger=False, accumulate_grad_batches=2.5)


@pytest.mark.parametrize("options", [{"max_epochs": 0}, {"max_epochs": 2}])
def test_estimated_stepping_batches_in_configure_optimizers_as_in_lightning(
    options: dict[str, Any],
) -> None:
    seen = {framework.name: _estimated(framework, **options) for framework in BOTH}
    assert seen["trainer"] == seen["lightning"]


def _estimated(framework: Framework, **options: Any) -> list[Any]:
    """``estimated_stepping_batches`` as read in ``configure_optimizers`` (5 batches)."""
    read: list[Any] = []

    class Sized(regression(framework.Module)):  # type: ignore[misc]
        def configure_optimizers(self) -> Any:
            read.append(self.trainer.estimated_stepping_batches)
            return super().configure_optimizers()

    run = framework.trainer(**quiet(**options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(Sized(), loader(10))
    return read
