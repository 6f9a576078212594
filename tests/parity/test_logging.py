"""Parity by difference: what ``self.log`` publishes, on lightning.pytorch 2.6 and on trainer.

Each scenario runs one module recipe on both frameworks, each with its own CSVLogger, and
compares ``callback_metrics`` (keys and values, at the end and at chosen hooks),
``logged_metrics`` and ``progress_bar_metrics`` keys, every cell of ``metrics.csv`` (key, step,
value) and what ``validate()`` / ``test()`` return. Lightning's run is the expected value: no
number here is written by hand.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, regression, snapshot

pl = pytest.importorskip("lightning.pytorch")

_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_validation_end", "on_train_end")


def _loader(n: int, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)


def _module_class(base: type, recipe: str, stop_at: int | None = None) -> type:
    """A regression module; ``recipe`` picks what it logs (the same on both frameworks);
    ``stop_at``: a batch index of the second epoch where ``on_train_batch_end`` stops the fit."""

    class Logging(regression(base)):  # type: ignore[misc, valid-type]
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log("batch_index", float(batch_idx))  # the defaults: on_step only
            if recipe == "options":
                self.log("train_mean", loss, on_step=False, on_epoch=True, reduce_fx="max")
                self.log("hidden", loss, logger=False)
            return loss

        def validation_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("val_loss", loss)  # the defaults: on_epoch only
            self.log("val_both", loss, on_step=True, on_epoch=True)
            if recipe == "options":
                self.log("val_bar", loss, on_step=True, on_epoch=True, prog_bar=True)
                self.log("val_only_step", loss, on_step=True, on_epoch=False)
                self.log("val_unlogged", loss, logger=False)

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch), on_step=True, on_epoch=True)
            if recipe == "options":
                self.log("test_unlogged", self.loss(batch), logger=False)

        def on_train_epoch_end(self):
            self.log("epoch_end_value", float(self.current_epoch) + 0.5)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if recipe == "batch_end":
                self.log("batch_end_value", float(batch_idx))
            if stop_at is not None and self.current_epoch == 1 and batch_idx == stop_at:
                self.trainer.should_stop = True

    return Logging


def _recorder(base: type, seen: list[tuple[str, dict[str, float]]]) -> Any:
    """A callback that copies ``callback_metrics`` at each hook of `_HOOKS`."""

    def record(name: str) -> Any:
        def hook(self, trainer_, *args: Any) -> None:
            seen.append((name, snapshot(trainer_.callback_metrics)))

        return hook

    return type("Recorder", (base,), {name: record(name) for name in _HOOKS})()


def _csv_cells(log_dir: str) -> list[tuple[str, int, float]]:
    with open(os.path.join(log_dir, "metrics.csv"), newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return sorted(
        (key, int(row["step"]), round(float(value), 5))
        for row in rows
        for key, value in row.items()
        if key != "step" and value not in ("", None)
    )


def _run(
    framework: str, root: Path, recipe: str, stop_at: int | None = None, **options: Any
) -> dict[str, Any]:
    """Fit, then validate and test, with a CSVLogger; everything the comparison reads."""
    options = {
        "max_epochs": 2,
        "log_every_n_steps": 2,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **options,
    }
    seen: list[tuple[str, dict[str, float]]] = []
    if framework == "lightning":
        logger = pl.loggers.CSVLogger(str(root), name="run", version=0)
        callback = _recorder(pl.Callback, seen)
        fit = pl.Trainer(logger=logger, accelerator="cpu", callbacks=[callback], **options)
        module = _module_class(pl.LightningModule, recipe, stop_at)()
        eval_options: dict[str, Any] = {"verbose": False}
    else:
        logger = trainer.loggers.CSVLogger(str(root), name="run", version=0)
        callback = _recorder(trainer.callbacks.Callback, seen)
        fit = trainer.Trainer(logger=logger, callbacks=[callback], **options)
        module = _module_class(trainer.TrainModule, recipe, stop_at)()
        eval_options = {}
    fit.fit(module, _loader(12), _loader(6, seed=1))
    after_fit = {
        "callback_metrics": snapshot(fit.callback_metrics),
        "logged_metrics": sorted(fit.logged_metrics),
        "progress_bar_metrics": sorted(fit.progress_bar_metrics),
        "global_step": fit.global_step,
    }
    validated = fit.validate(module, _loader(6, seed=1), **eval_options)
    after_validate = {
        "callback_metrics": snapshot(fit.callback_metrics),
        "logged_metrics": sorted(fit.logged_metrics),
        "progress_bar_metrics": sorted(fit.progress_bar_metrics),
    }
    tested = fit.test(module, _loader(6, seed=2), **eval_options)
    return {
        "hooks": seen,
        "after_fit": after_fit,
        "validate": [snapshot(result) for result in validated],
        "after_validate": after_validate,
        "test": [snapshot(result) for result in tested],
        "after_test_logged": sorted(fit.logged_metrics),
        "csv": _csv_cells(logger.log_dir),
    }


def _assert_same(
    tmp_path: Path, recipe: str = "basic", *, known: tuple[Any, Any] | None = None, **options: Any
) -> dict[str, Any]:
    """Run both; every fact must agree, except the one ``known`` (missing, extra) csv cell pair."""
    expected = _run("lightning", tmp_path / "lightning", recipe, **options)
    received = _run("trainer", tmp_path / "trainer", recipe, **options)
    for key in expected:
        if key == "csv":
            missing = sorted(set(expected[key]) - set(received[key]))
            extra = sorted(set(received[key]) - set(expected[key]))
            allowed = ([], []) if known is None else ([known[0]], [known[1]])
            assert (missing, extra) == allowed, "metrics.csv cells (missing, extra)"
            if known is not None:
                continue
        assert received[key] == expected[key], key
    return received


def test_step_and_epoch_metrics_in_every_stage(tmp_path: Path) -> None:
    """log_every_n_steps=2: training rows at steps 1, 3, 5, ...; epoch rows at the step of the
    epoch's last batch; validation/test step rows numbered by batch; ``_epoch`` keys returned."""
    received = _assert_same(tmp_path, num_sanity_val_steps=0)
    assert [list(result) for result in received["validate"]] == [["val_both_epoch", "val_loss"]]
    assert [list(result) for result in received["test"]] == [["test_loss_epoch"]]
    train_steps = sorted({step for key, step, _ in received["csv"] if key == "train_loss_step"})
    assert train_steps == [1, 3, 5, 7, 9, 11]


def test_metrics_csv_writes_the_epoch_as_a_float(tmp_path: Path) -> None:
    """The one deliberate difference in metrics.csv (docs/migration/lightning.md): every value,
    the epoch included, is written as a float ("0.0"; Lightning writes "0")."""
    columns = {}
    for framework in ("lightning", "trainer"):
        _run(framework, tmp_path / framework, "basic", num_sanity_val_steps=0, max_epochs=1)
        path = tmp_path / framework / "run" / "version_0" / "metrics.csv"
        with open(path, newline="", encoding="utf-8") as file:
            columns[framework] = {row["epoch"] for row in csv.DictReader(file)} - {""}
    assert columns == {"lightning": {"0", "1"}, "trainer": {"0.0", "1.0"}}


def test_options_sanity_check_and_metrics_kept_between_epochs(tmp_path: Path) -> None:
    """prog_bar / logger=False / on_epoch-only / step-only validation metrics, after a sanity
    check (which leaves nothing behind); callback_metrics read at epoch start still hold the
    previous epoch's values."""
    received = _assert_same(tmp_path, recipe="options", num_sanity_val_steps=2)
    second_epoch_start = [m for hook, m in received["hooks"] if hook == "on_train_epoch_start"][1]
    assert "train_loss_epoch" in second_epoch_start and "val_loss" in second_epoch_start


def test_gradient_accumulation_logs_once_per_optimizer_step(tmp_path: Path) -> None:
    _assert_same(tmp_path, accumulate_grad_batches=2, log_every_n_steps=1)


def test_fractional_val_check_interval(tmp_path: Path) -> None:
    _assert_same(tmp_path, val_check_interval=0.5, log_every_n_steps=1)


def test_validation_every_second_epoch(tmp_path: Path) -> None:
    _assert_same(tmp_path, check_val_every_n_epoch=2, max_epochs=4, log_every_n_steps=3)


# Lightning writes a training step row after on_train_batch_end, and also for the batch that
# sets should_stop (outside the log_every_n_steps cadence): so does trainer.
def test_value_logged_in_on_train_batch_end_joins_its_batch_row(tmp_path: Path) -> None:
    _assert_same(tmp_path, recipe="batch_end", num_sanity_val_steps=0)


def test_the_batch_that_stops_the_fit_writes_its_row(tmp_path: Path) -> None:
    # The row is there at the same step; its epoch differs by the documented current_epoch
    # difference (Lightning counts the stopped epoch as done before writing it).
    _assert_same(
        tmp_path,
        stop_at=2,
        num_sanity_val_steps=0,
        log_every_n_steps=4,
        known=(("epoch", 9, 2.0), ("epoch", 9, 1.0)),
    )


@pytest.mark.parametrize("add_dataloader_idx", [True, False])
def test_a_name_holding_the_dataloader_suffix(add_dataloader_idx: bool) -> None:
    """``self.log("acc/dataloader_idx_0", ...)`` is refused while the framework adds that suffix
    itself (the two would collide), and logged as given with ``add_dataloader_idx=False``."""

    def run(fw: Any) -> Any:
        class Suffixed(regression(fw.Module)):  # type: ignore[misc]
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("acc/dataloader_idx_0", loss, add_dataloader_idx=add_dataloader_idx)
                return loss

        fit = fw.trainer(**quiet(max_epochs=1))
        try:
            fit.fit(Suffixed(), loader(4))
        except Exception as error:  # each framework raises its own class; the message is compared
            return "dataloader_idx" in str(error)
        return sorted(fit.callback_metrics)

    expected = run(LIGHTNING)
    assert expected == (True if add_dataloader_idx else ["acc/dataloader_idx_0"])
    assert run(TRAINER) == expected


@pytest.mark.parametrize(
    "hook",
    ["on_fit_start", "on_validation_end", "on_save_checkpoint", "on_train_end", "on_fit_end"],
)
def test_logging_in_a_hook_lightning_refuses_it_in(hook: str) -> None:
    """Lightning raises for ``self.log`` where no step or epoch of logged metrics is open;
    trainer took it (in ``on_validation_end`` the value then vanished without a word)."""

    def run(fw: Any) -> str:
        class Logging(regression(fw.Module)):  # type: ignore[misc]
            pass

        def log_there(self, *args):
            self.log("x", 1.0)

        setattr(Logging, hook, log_there)
        fit = fw.trainer(**quiet(max_epochs=1, enable_checkpointing=hook == "on_save_checkpoint"))
        with pytest.raises(Exception, match=hook) as info:
            fit.fit(Logging(), loader(4), loader(2))
        return type(info.value).__name__

    assert run(LIGHTNING) == "MisconfigurationException"
    assert run(TRAINER) == "ConfigurationError"
