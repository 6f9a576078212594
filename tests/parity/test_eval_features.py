"""Parity by difference: evaluation features, on lightning.pytorch 2.6 and on trainer.

Several validation / test / predict dataloaders (a list, a dict, a list of one): the hooks and
steps with their ``batch_idx`` / ``dataloader_idx``, ``callback_metrics`` / ``logged_metrics`` /
``progress_bar_metrics``, every ``metrics.csv`` cell, what ``validate()`` / ``test()`` /
``predict()`` return. Also ``Trainer(inference_mode=...)``, the default ``predict_step``, and
``checkpoint_callbacks`` / ``progress_bar_callback``. Lightning's run is the expected value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.frameworks import (
    LIGHTNING,
    TRAINER,
    csv_cells,
    loader,
    quiet,
    recording_callback,
    snapshot,
)
from tests.parity.frameworks import regression as regression_class

_EVAL_HOOKS = tuple(
    f"on_{stage}_{hook}"
    for stage in ("validation", "test", "predict")
    for hook in ("batch_start", "batch_end", "epoch_end")
)


def _multi_module(fw: Any, calls: list[Any]) -> Any:
    class Multi(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            calls.append(("m:validation_step", batch_idx, dataloader_idx))
            loss = self.loss(batch)
            self.log("val_loss", loss)
            self.log("val_both", loss, on_step=True, on_epoch=True, prog_bar=True)
            if dataloader_idx == 0:
                self.log("val_plain", loss, add_dataloader_idx=False)

        def on_validation_epoch_end(self):
            self.log("val_epoch_end", float(self.current_epoch) + 0.5)

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            calls.append(("m:test_step", batch_idx, dataloader_idx))
            self.log("test_loss", self.loss(batch), on_step=True, on_epoch=True)

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return (dataloader_idx, batch_idx, round(float(self.net(batch[0]).sum()), 4))

    return Multi()


def _metrics(fit: Any) -> dict[str, Any]:
    return {
        "callback_metrics": snapshot(fit.callback_metrics),
        "logged_metrics": sorted(fit.logged_metrics),
        "progress_bar_metrics": sorted(fit.progress_bar_metrics),
    }


def _multi_run(fw: Any, root: Path, shape: str) -> dict[str, Any]:
    """Fit with validation loaders given as ``shape``, then validate, test and predict."""
    val_a, val_b = loader(6, seed=1), loader(4, seed=2)
    data = {
        "list": [val_a, val_b],
        "dict": {"a": val_a, "b": val_b},
        "list of one": [val_a],
    }[shape]
    calls: list[Any] = []
    logger = fw.loggers.CSVLogger(str(root), name="run", version=0)
    recorder = recording_callback(fw.Callback, calls, _EVAL_HOOKS)
    options = quiet(max_epochs=2, log_every_n_steps=2, logger=logger, callbacks=[recorder])
    fit = fw.trainer(**options)
    module = _multi_module(fw, calls)
    fit.fit(module, loader(8), data)
    facts: dict[str, Any] = {"after_fit": _metrics(fit)}
    validated = fit.validate(module, data, **fw.eval_options)
    facts["validate"] = [snapshot(result) for result in validated]
    facts["after_validate"] = _metrics(fit)
    tested = fit.test(module, data, **fw.eval_options)
    facts["test"] = [snapshot(result) for result in tested]
    facts["predict"] = fit.predict(module, data)
    facts["calls"] = calls
    facts["csv"] = csv_cells(logger.log_dir)
    return facts


@pytest.mark.parametrize("shape", ["list", "dict", "list of one"])
def test_several_dataloaders_match_lightning(tmp_path: Path, shape: str) -> None:
    expected = _multi_run(LIGHTNING, tmp_path / "lightning", shape)
    received = _multi_run(TRAINER, tmp_path / "trainer", shape)
    for key in expected:
        assert received[key] == expected[key], key
    if shape != "list of one":
        assert "val_loss/dataloader_idx_1" in received["after_fit"]["callback_metrics"]
        assert len(received["validate"]) == 2


def _raises_without_dataloader_idx(fw: Any) -> bool:
    class NoIndex(regression_class(fw.Module)):  # type: ignore[misc]
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch))

    try:
        fw.trainer(**quiet()).validate(NoIndex(), [loader(4), loader(4)], **fw.eval_options)
    except Exception:  # RuntimeError in Lightning, ConfigurationError here
        return True
    return False


def test_a_step_without_dataloader_idx_is_refused_with_several_loaders() -> None:
    assert _raises_without_dataloader_idx(TRAINER) is _raises_without_dataloader_idx(LIGHTNING)


# ---- inference_mode --------------------------------------------------------------------------
def _grad_modes(fw: Any, inference_mode: bool) -> list[Any]:
    seen: list[Any] = []

    def note(where: str) -> None:
        seen.append((where, torch.is_inference_mode_enabled(), torch.is_grad_enabled()))

    class Probe(regression_class(fw.Module)):  # type: ignore[misc]
        def validation_step(self, batch, batch_idx):
            note(
                f"validation_step {self.trainer.state.fn if hasattr(self.trainer.state, 'fn') else ''}"
            )
            self.log("val_loss", self.loss(batch))

        def on_validation_start(self):
            note("on_validation_start")

        def on_validation_epoch_end(self):
            note("on_validation_epoch_end")

        def test_step(self, batch, batch_idx):
            note("test_step")

        def on_test_end(self):
            note("on_test_end")

        def predict_step(self, batch, batch_idx):
            note("predict_step")
            return self.net(batch[0])

        def on_train_epoch_end(self):
            note("on_train_epoch_end")

    fit = fw.trainer(**quiet(max_epochs=1, inference_mode=inference_mode))
    module = Probe()
    fit.fit(module, loader(4), loader(2))
    for call in (fit.validate, fit.test, fit.predict):
        options = fw.eval_options if call != fit.predict else {}
        call(module, loader(2), **options)
    return [(where.split(" ")[0], *flags) for where, *flags in seen]


@pytest.mark.parametrize("inference_mode", [True, False])
def test_inference_mode_as_in_lightning(inference_mode: bool) -> None:
    """validate/test/predict run under torch.inference_mode (True) or no_grad (False); validation
    inside fit always under no_grad; the hooks of the stage too."""
    assert _grad_modes(TRAINER, inference_mode) == _grad_modes(LIGHTNING, inference_mode)


# ---- the default predict_step -----------------------------------------------------------------
def _default_predictions(fw: Any) -> list[list[float]]:
    class WithForward(regression_class(fw.Module)):  # type: ignore[misc]
        def forward(self, batch):
            return self.net(batch[0])

    outputs = fw.trainer(**quiet()).predict(WithForward(), loader(6))
    return [[round(v, 5) for v in output.flatten().tolist()] for output in outputs]


def test_default_predict_step_calls_forward_on_the_batch() -> None:
    assert _default_predictions(TRAINER) == _default_predictions(LIGHTNING)


# ---- checkpoint_callbacks / progress_bar_callback ----------------------------------------------
def _callback_properties(fw: Any, tmp_path: Path, **options: Any) -> dict[str, Any]:
    callbacks = [
        fw.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="a", every_n_epochs=1),
        fw.callbacks.OnExceptionCheckpoint(dirpath=tmp_path),
        fw.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="b", every_n_epochs=2),
    ]
    fit = fw.trainer(callbacks=callbacks, logger=False, **options)
    return {
        "checkpoint_callbacks": [type(cb).__name__ for cb in fit.checkpoint_callbacks],
        "first": type(fit.checkpoint_callback).__name__,
        "has_progress_bar": fit.progress_bar_callback is not None,
    }


@pytest.mark.parametrize("enable_progress_bar", [True, False])
def test_checkpoint_callbacks_and_progress_bar_callback(
    tmp_path: Path, enable_progress_bar: bool
) -> None:
    expected = _callback_properties(LIGHTNING, tmp_path, enable_progress_bar=enable_progress_bar)
    received = _callback_properties(TRAINER, tmp_path, enable_progress_bar=enable_progress_bar)
    assert received == expected


# ---- validate / test / predict without a module after fit --------------------------------------
def _after_fit_without_module(fw: Any, tmp_path: Path) -> list[Any]:
    """``trainer.fit(model, ...)`` then ``trainer.test(dataloaders=...)``, the usual last lines
    of a Lightning script: val_loss is lowest after epoch 0, so the best checkpoint is not the
    final weights."""

    class Rising(regression_class(fw.Module)):  # type: ignore[misc]
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", float(self.current_epoch))

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch))

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])

    checkpoint = fw.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")
    fit = fw.trainer(callbacks=[checkpoint], **quiet(max_epochs=3, enable_checkpointing=True))
    fit.fit(Rising(), loader(8), loader(4, seed=1))
    outcome: list[Any] = []
    for call, options in (
        ("test", fw.eval_options),
        ("validate", fw.eval_options),
        ("predict", {}),
    ):
        with pytest.warns(UserWarning, match="best"):
            result = getattr(fit, call)(dataloaders=loader(4, seed=2), **options)
        if call == "predict":
            result = [round(v, 5) for batch in result for v in batch.flatten().tolist()]
        outcome.append((call, Path(fit.ckpt_path).name.removesuffix(".ckpt"), result))
    no_checkpoints = fw.trainer(**quiet(max_epochs=1))
    no_checkpoints.fit(Rising(), loader(8))
    with pytest.raises(Exception, match="ModelCheckpoint") as info:
        no_checkpoints.test(dataloaders=loader(4, seed=2), **fw.eval_options)
    outcome.append(type(info.value).__name__ in ("ValueError", "ConfigurationError"))
    return outcome


def test_evaluating_without_a_module_after_fit_uses_the_best_checkpoint(tmp_path: Path) -> None:
    """Lightning loads the best checkpoint of the previous fit (and warns) when validate / test
    / predict get no module and no ckpt_path; trainer used the final weights, so the same script
    reported other test metrics. With no ModelCheckpoint both refuse."""
    expected = _after_fit_without_module(LIGHTNING, tmp_path / "lightning")
    assert expected[0][1] == "epoch=0-step=4"
    received = _after_fit_without_module(TRAINER, tmp_path / "trainer")
    assert received == expected


def test_predict_without_predict_step_or_forward_is_refused() -> None:
    def predict(fw: Any) -> str:
        with pytest.raises(Exception, match="forward") as info:
            fw.trainer(**quiet()).predict(regression_class(fw.Module)(), loader(4))
        return type(info.value).__name__

    assert predict(LIGHTNING) == "MisconfigurationException"
    assert predict(TRAINER) == "ConfigurationError"


def _evaluated_from_a_checkpoint(fw: Any, tmp_path: Path) -> list[Any]:
    """A DataModule whose ``state_dict`` holds a statistic fit computed (a normalization
    shift), and a callback with state; a new Trainer in an evaluation script then runs
    validate / test / predict with the checkpoint."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    import trainer
    from tests.parity.frameworks import dataset

    restored: list[Any] = []
    base = pl.LightningDataModule if fw is LIGHTNING else trainer.DataModule

    class Shifted(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.shift = 0.0

        def setup(self, stage):
            if stage == "fit":
                self.shift = 1.5  # computed from the training data

        def train_dataloader(self):
            return loader(8)

        def _shifted(self):
            x, y = dataset(4, seed=2).tensors
            return DataLoader(TensorDataset(x + self.shift, y), batch_size=2)

        val_dataloader = test_dataloader = predict_dataloader = _shifted

        def state_dict(self):
            return {"shift": self.shift}

        def load_state_dict(self, state):
            restored.append(("datamodule", state))
            self.shift = state["shift"]

    class Counting(fw.Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.count = 0

        def on_train_batch_end(self, *args):
            self.count += 1

        def state_dict(self):
            return {"count": self.count}

        def load_state_dict(self, state):
            restored.append(("callback", state))

    class Module(regression_class(fw.Module)):  # type: ignore[misc]
        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch))

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])

    options = quiet(max_epochs=1, enable_checkpointing=True)
    saving = fw.callbacks.ModelCheckpoint(dirpath=tmp_path)
    fit = fw.trainer(callbacks=[Counting(), saving], **options)
    fit.fit(Module(), datamodule=Shifted())
    path = fit.checkpoint_callback.best_model_path
    results: list[Any] = []
    for call in ("validate", "test", "predict"):
        evaluator = fw.trainer(callbacks=[Counting()], **options)
        extra = fw.eval_options if call != "predict" else {}
        results.append(
            getattr(evaluator, call)(Module(), datamodule=Shifted(), ckpt_path=path, **extra)
        )
    results[2] = [round(v, 5) for batch in results[2] for v in batch.flatten().tolist()]
    return [restored, results[:2], results[2]]


def test_evaluating_from_a_checkpoint_restores_the_datamodule_and_callbacks(tmp_path) -> None:
    """Lightning restores the DataModule's and the callbacks' states for validate / test /
    predict with a ckpt_path; trainer restored them only for fit, so the DataModule evaluated
    with its initial statistic: other metrics, no error."""
    expected = _evaluated_from_a_checkpoint(LIGHTNING, tmp_path / "lightning")
    assert expected[0].count(("datamodule", {"shift": 1.5})) == 3
    assert _evaluated_from_a_checkpoint(TRAINER, tmp_path / "trainer") == expected
