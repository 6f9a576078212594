"""Parity by difference: more of what ported code reads on the Trainer and the module, on
lightning.pytorch 2.6 and trainer.

``trainer.val_dataloaders`` / ``test_dataloaders`` / ``predict_dataloaders``,
``num_sanity_val_batches``, ``enable_validation``, ``distributed_sampler_kwargs`` and ``scaler``
read in the hooks of fit, test and predict; ``trainer.init_module()`` under each true precision
and with ``empty_init``; ``hparams_initial``; ``strict_loading`` when resuming a checkpoint that
lacks a layer. Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import trainer
from tests.parity.frameworks import BOTH, LIGHTNING, TRAINER, Framework, loader, quiet, regression

pytest.importorskip("lightning.pytorch")


def _loaders_seen(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return ["list", len(value)]
    return "one"


def _reading(framework: Framework, seen: list[Any]) -> Any:
    class Reading(framework.Callback):  # type: ignore[misc, name-defined]
        def _read(self, trainer: Any, hook: str) -> None:
            seen.append(
                (
                    hook,
                    _loaders_seen(trainer.val_dataloaders),
                    _loaders_seen(trainer.test_dataloaders),
                    _loaders_seen(trainer.predict_dataloaders),
                    trainer.num_sanity_val_batches,
                    trainer.enable_validation,
                    trainer.distributed_sampler_kwargs,
                    trainer.scaler,
                )
            )

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self._read(trainer, "on_train_start")

        def on_test_start(self, trainer: Any, module: Any) -> None:
            self._read(trainer, "on_test_start")

        def on_predict_start(self, trainer: Any, module: Any) -> None:
            self._read(trainer, "on_predict_start")

    return Reading()


def _two_loader_regression(framework: Framework) -> Any:
    class TwoLoaders(regression(framework.Module)):  # type: ignore[misc]
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("val_loss", self.loss(batch))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", self.loss(batch))

        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            return self.net(batch[0])

    return TwoLoaders()


def test_trainer_attributes_as_in_lightning() -> None:
    seen: dict[str, list[Any]] = {}
    for framework in BOTH:
        calls: list[Any] = []
        module = _two_loader_regression(framework)
        run = framework.trainer(
            **quiet(max_epochs=1, num_sanity_val_steps=3, callbacks=[_reading(framework, calls)])
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(module, loader(8), [loader(4, seed=1), loader(10, seed=2)])
            run.test(module, loader(4, seed=3), **framework.eval_options)
            run.predict(module, [loader(4, seed=4), loader(2, seed=5)])
        seen[framework.name] = calls
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][0][4] == [2, 3]  # min(num_sanity_val_steps, batches) per loader


@pytest.mark.parametrize("precision", ["32-true", "bf16-true", "64-true"])
def test_init_module_as_in_lightning(precision: str) -> None:
    seen = {}
    for framework in BOTH:
        run = framework.trainer(**quiet(precision=precision))
        with run.init_module():
            layer = torch.nn.Linear(3, 2)
        torch.manual_seed(0)
        with run.init_module(empty_init=True):
            skipped = torch.nn.Linear(3, 2)
        after_empty = torch.rand(1).item()  # the init functions drew nothing
        seen[framework.name] = (
            layer.weight.dtype,
            layer.weight.device.type,
            skipped.weight.dtype,
            after_empty,
        )
    assert seen["trainer"] == seen["lightning"]
    torch.manual_seed(0)
    assert seen["trainer"][3] == torch.rand(1).item()


def test_hparams_initial_as_in_lightning() -> None:
    seen = {}
    for framework in BOTH:

        class Tuned(framework.Module):  # type: ignore[misc, name-defined]
            def __init__(self, lr: float = 0.1, layers: tuple[int, ...] = (4, 2)) -> None:
                super().__init__()
                self.save_hyperparameters()

        module = Tuned(lr=0.5)
        module.hparams.lr = 0.01  # tuned afterwards: hparams_initial keeps what was saved
        initial = module.hparams_initial
        initial["layers"] = (1,)  # a copy each time
        seen[framework.name] = (dict(module.hparams), dict(module.hparams_initial))
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][1] == {"lr": 0.5, "layers": (4, 2)}


def _headed(framework: Framework, *, with_head: bool, strict: bool) -> Any:
    class Headed(regression(framework.Module)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.strict_loading = strict
            if with_head:
                self.head = torch.nn.Linear(1, 1)  # frozen: not in the optimizer

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.net.parameters(), lr=0.05)

    return Headed()


@pytest.mark.parametrize("strict", [True, False])
def test_strict_loading_as_in_lightning(tmp_path, strict: bool) -> None:
    seen = {}
    for framework in BOTH:
        root = tmp_path / framework.name
        first = framework.trainer(
            **quiet(max_epochs=1, enable_checkpointing=True, default_root_dir=str(root))
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first.fit(_headed(framework, with_head=False, strict=True), loader(8))
        path = first.checkpoint_callback.best_model_path
        module = _headed(framework, with_head=True, strict=strict)
        second = framework.trainer(**quiet(max_epochs=2))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                second.fit(module, loader(8), ckpt_path=path)
            outcome: Any = [p.detach().flatten().tolist() for p in module.parameters()]
        except Exception:
            outcome = "raised"
        seen[framework.name] = outcome
    assert seen["trainer"] == seen["lightning"]
    assert (seen["trainer"] == "raised") is strict


def _stage_name(stage: Any) -> str:
    """Lightning passes its TrainerFn (a str enum), trainer a str: the same value."""
    return next(name for name in ("fit", "validate", "test", "predict") if stage == name)


def _preparing(framework: Framework, calls: list[str]) -> tuple[Any, Any]:
    import lightning.pytorch as pl

    import trainer

    base = pl.LightningDataModule if framework.name == "lightning" else trainer.DataModule

    class Data(base):  # type: ignore[misc, valid-type]
        def prepare_data(self) -> None:
            calls.append("datamodule.prepare_data")

        def setup(self, stage: str) -> None:
            calls.append(f"datamodule.setup:{_stage_name(stage)}")

        def train_dataloader(self) -> Any:
            return loader(8)

        def test_dataloader(self) -> Any:
            return loader(4)

    class Preparing(regression(framework.Module)):  # type: ignore[misc]
        def prepare_data(self) -> None:
            calls.append("module.prepare_data")

        def setup(self, stage: str) -> None:
            calls.append(f"module.setup:{_stage_name(stage)}")

        def test_step(self, batch: Any, batch_idx: int) -> None:
            pass

    return Preparing(), Data()


def test_prepare_data_as_in_lightning() -> None:
    seen = {}
    for framework in BOTH:
        calls: list[str] = []
        module, data = _preparing(framework, calls)
        run = framework.trainer(**quiet(max_epochs=1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(module, datamodule=data)
            run.test(module, datamodule=data, **framework.eval_options)
        seen[framework.name] = calls
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][:2] == ["datamodule.prepare_data", "module.prepare_data"]


def _failing(framework: Framework, calls: list[str]) -> tuple[Any, Any, Any]:
    import lightning.pytorch as pl

    import trainer

    base = pl.LightningDataModule if framework.name == "lightning" else trainer.DataModule

    class Data(base):  # type: ignore[misc, valid-type]
        def train_dataloader(self) -> Any:
            return loader(8)

        def on_exception(self, exception: BaseException) -> None:
            calls.append(f"datamodule.on_exception:{exception}")

    class Watching(framework.Callback):  # type: ignore[misc, name-defined]
        def on_exception(self, trainer_: Any, module: Any, exception: BaseException) -> None:
            calls.append(f"callback.on_exception:{exception}")

    class Failing(regression(framework.Module)):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 2:
                raise ValueError("bad batch")
            return super().training_step(batch, batch_idx)

    return Failing(), Data(), Watching()


def test_datamodule_on_exception_as_in_lightning() -> None:
    seen = {}
    for framework in BOTH:
        calls: list[str] = []
        module, data, watching = _failing(framework, calls)
        run = framework.trainer(**quiet(max_epochs=1, callbacks=[watching]))
        with warnings.catch_warnings(), pytest.raises(ValueError, match="bad batch"):
            warnings.simplefilter("ignore")
            run.fit(module, datamodule=data)
        seen[framework.name] = calls
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"] == [
        "callback.on_exception:bad batch",
        "datamodule.on_exception:bad batch",
    ]


def _should_stop_seen(fw: Framework) -> list[Any]:
    """A callback stops the first fit at batch 1; what ``should_stop`` reads afterwards."""
    seen: list[Any] = []

    class Watch(fw.Callback):  # type: ignore[misc, valid-type]
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1 and trainer.current_epoch == 0:
                trainer.should_stop = True

        def on_validation_start(self, trainer, module):
            seen.append(("validation", trainer.should_stop))

        def on_test_start(self, trainer, module):
            seen.append(("test", trainer.should_stop))

        def on_train_start(self, trainer, module):
            seen.append(("train", trainer.should_stop))

    class Tested(regression(fw.Module)):
        def test_step(self, batch, batch_idx):
            pass

    fit = fw.trainer(**quiet(max_epochs=2, num_sanity_val_steps=0, callbacks=[Watch()]))
    module = Tested()
    fit.fit(module, loader(8), loader(4))
    fit.validate(module, loader(4), **fw.eval_options)
    fit.test(module, loader(4), **fw.eval_options)
    fit.fit_loop.max_epochs = 3  # Lightning's way to train on
    fit.fit(module, loader(8))
    seen.append(("after second fit", fit.should_stop))
    return [tuple(str(v) for v in item) for item in seen]


def test_should_stop_stays_set_after_a_stopped_fit_as_in_lightning() -> None:
    """Lightning resets ``should_stop`` only when a fit starts: validate and test after a fit
    that stopped early still read True (the loggers' "log every batch" rule depends on it)."""
    expected = _should_stop_seen(BOTH[0])
    assert ("test", "True") in expected
    assert _should_stop_seen(BOTH[1]) == expected


def _fast_dev_run(fw: Framework, root: str, logger: Any) -> Any:
    class Logging(regression(fw.Module)):
        def training_step(self, batch, batch_idx):
            self.logger.experiment.add_scalar("direct", 1.0, batch_idx)  # no `if self.logger`
            self.logger.log_metrics({"direct": 1.0}, step=batch_idx)
            return super().training_step(batch, batch_idx)

    callbacks = [fw.callbacks.LearningRateMonitor(), fw.callbacks.DeviceStatsMonitor()]
    options = quiet(fast_dev_run=2, default_root_dir=root, callbacks=callbacks)
    fit = fw.trainer(**{**options, "logger": logger})
    fit.fit(Logging(), loader(8), loader(4))
    return fit.global_step, [type(logger).__name__ for logger in fit.loggers]


def test_fast_dev_run_puts_a_dummy_logger_in_place_as_in_lightning(tmp_path) -> None:
    """A smoke test of a project that logs through ``self.logger`` and monitors that need a
    logger runs, and writes nothing (Lightning's DummyLogger)."""
    for fw in BOTH:
        root = tmp_path / fw.name
        logger = fw.loggers.CSVLogger(str(root / "logs"))
        assert _fast_dev_run(fw, str(root), logger) == (2, ["DummyLogger"])
        assert not (root / "logs").exists()


def _switches(fw: Framework, root: str, **options: Any) -> tuple[Any, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fw.trainer(default_root_dir=root, **options)
    summaries = [c for c in fit.callbacks if "ModelSummary" in type(c).__name__]
    return (
        fit.logger is not None,
        fit.checkpoint_callback is not None,
        fit.progress_bar_callback is not None,
        bool(summaries),
        fit.log_every_n_steps,
    )


@pytest.mark.parametrize(
    "options",
    [
        {"logger": None},
        {"enable_checkpointing": None},
        {"enable_progress_bar": None, "enable_model_summary": None},
        {"log_every_n_steps": None},
        {"barebones": True, "logger": None},
    ],
    ids=["logger", "checkpointing", "bar-and-summary", "log_every_n_steps", "barebones"],
)
def test_none_is_the_default_for_the_opt_out_switches_as_in_lightning(
    tmp_path, options: dict[str, Any]
) -> None:
    """``Trainer(logger=None)`` (as in ``logger=wandb if use_wandb else None``) is Lightning's
    default logger, not none; likewise None for the enable_* switches and log_every_n_steps."""
    expected = _switches(BOTH[0], str(tmp_path / "l"), **options)
    compared = 4 if "barebones" in options else 5  # barebones: Lightning's log_every_n_steps is 0
    assert _switches(BOTH[1], str(tmp_path / "t"), **options)[:compared] == expected[:compared]
    assert expected[:4] == ((False,) * 4 if "barebones" in options else (True,) * 4)


def test_none_is_the_default_of_the_validation_and_clipping_arguments_as_in_lightning(
    tmp_path,
) -> None:
    """None is 1.0 / 2, and clipping by norm (Lightning keeps None and clips by norm then)."""
    options = quiet(val_check_interval=None, num_sanity_val_steps=None, gradient_clip_val=0.5)
    read = []
    for fw in BOTH:
        fit = fw.trainer(**options, gradient_clip_algorithm=None)
        read.append((fit.val_check_interval, fit.num_sanity_val_steps))
    assert read[1] == read[0] == (1.0, 2)
    assert BOTH[1].trainer(**options, gradient_clip_algorithm=None).gradient_clip_algorithm == (
        "norm"
    )


def _datamodule_in_place_of_loaders(fw: Any) -> list[Any]:
    """``trainer.fit(model, dm)`` / ``trainer.test(model, dm)``: the DataModule passed where the
    dataloaders go, a common shorthand Lightning accepts."""
    import lightning.pytorch as pl

    base = pl.LightningDataModule if fw is LIGHTNING else trainer.DataModule

    class Data(base):  # type: ignore[misc, valid-type]
        def train_dataloader(self):
            return loader(8)

        def val_dataloader(self):
            return loader(4, seed=1)

        def test_dataloader(self):
            return loader(4, seed=2)

    class Tested(regression(fw.Module)):  # type: ignore[misc]
        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch))

    module, fit = Tested(), fw.trainer(**quiet(max_epochs=1))
    fit.fit(module, Data())
    return [
        fit.global_step,
        fit.validate(module, Data(), **fw.eval_options),
        fit.test(module, Data(), **fw.eval_options),
    ]


def test_a_datamodule_in_place_of_the_dataloaders() -> None:
    expected = _datamodule_in_place_of_loaders(LIGHTNING)
    assert _datamodule_in_place_of_loaders(TRAINER) == expected
    assert expected[0] == 4


def _extended_through_fit_loop(fw: Any) -> list[Any]:
    """``trainer.fit_loop.max_epochs``: read, raised from a callback during fit, then raised
    again between two fits (a notebook training on), as Lightning's documentation shows."""
    seen: list[Any] = []

    class Extend(fw.Callback):  # type: ignore[misc, valid-type]
        def on_train_epoch_end(self, trainer_, module):
            seen.append((trainer_.current_epoch, trainer_.fit_loop.max_epochs))
            if trainer_.current_epoch == 1 and trainer_.fit_loop.max_epochs == 2:
                trainer_.fit_loop.max_epochs = 3

    fit = fw.trainer(**quiet(max_epochs=2, callbacks=[Extend()]))
    module = regression(fw.Module)()
    seen.append(("before", fit.fit_loop.max_epochs, fit.fit_loop.max_steps))
    fit.fit(module, loader(8))
    seen.append(("after", fit.current_epoch, fit.global_step, fit.fit_loop.max_epochs))
    fit.fit_loop.max_epochs = 5
    fit.fit(module, loader(8))
    seen.append(("again", fit.current_epoch, fit.global_step, fit.max_epochs))
    return seen


def test_fit_loop_max_epochs_extends_training_as_in_lightning() -> None:
    expected = _extended_through_fit_loop(LIGHTNING)
    assert expected[-1] == ("again", 5, 20, 5)
    assert _extended_through_fit_loop(TRAINER) == expected
