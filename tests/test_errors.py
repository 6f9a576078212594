"""The catalogue of bad inputs (DESIGN §8): each raises a TrainerError subclass that names the
hook or argument and says how to fix it."""

from __future__ import annotations

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer._imports import require
from trainer.errors import (
    AnomalyError,
    CheckpointError,
    ConfigurationError,
    HookResultError,
    MissingDependencyError,
    StrategyError,
    TrainerError,
)


def test_hierarchy():
    for cls in (
        AnomalyError,
        CheckpointError,
        trainer.CheckpointMismatchError,
        trainer.CheckpointNotFoundError,
        ConfigurationError,
        HookResultError,
        MissingDependencyError,
        StrategyError,
    ):
        assert issubclass(cls, TrainerError)
        assert getattr(trainer, cls.__name__) is cls


def test_module_without_training_step(tmp_path):
    class NoStep(trainer.TrainModule):
        def configure_optimizers(self):
            return None

    with pytest.raises(
        ConfigurationError, match=r"NoStep has no training_step\. Implement training_step"
    ):
        quiet_trainer(tmp_path).fit(NoStep(), make_loader())


def test_training_step_returning_a_string(tmp_path):
    class Stringy(LinearModule):
        def training_step(self, batch, batch_idx):
            return "loss" if batch_idx == 3 else super().training_step(batch, batch_idx)

    with pytest.raises(HookResultError) as info:
        quiet_trainer(tmp_path, max_epochs=1).fit(Stringy(), make_loader())
    assert str(info.value) == (
        'training_step returned str; expected a Tensor, a dict with "loss", or None '
        "(Stringy.training_step, epoch 0, batch 3). Return the loss tensor."
    )


def test_training_step_dict_without_loss(tmp_path):
    class NoLoss(LinearModule):
        def training_step(self, batch, batch_idx):
            return {"out": 1}

    with pytest.raises(HookResultError, match="without a 'loss' Tensor"):
        quiet_trainer(tmp_path, max_epochs=1).fit(NoLoss(), make_loader())


def test_detached_loss_is_named(tmp_path):
    class Detached(LinearModule):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx).detach()

    with pytest.raises(HookResultError, match="does not require grad.*without .detach()"):
        quiet_trainer(tmp_path, max_epochs=1).fit(Detached(), make_loader())


def test_configure_optimizers_returning_none(tmp_path):
    class NoOpt(LinearModule):
        def configure_optimizers(self):
            return None

    with pytest.raises(
        HookResultError,
        match=r"configure_optimizers returned None.*NoOpt\.configure_optimizers.*AdamW",
    ):
        quiet_trainer(tmp_path).fit(NoOpt(), make_loader())


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        (42, r"returned 42 \(type int\)"),
        ({"lr_scheduler": None}, "without the key 'optimizer'"),
        ("adam", r"returned 'adam' \(type str\)"),
    ],
)
def test_configure_optimizers_bad_forms(tmp_path, returned, match):
    class Bad(LinearModule):
        def configure_optimizers(self):
            return returned

    with pytest.raises(HookResultError, match=match):
        quiet_trainer(tmp_path).fit(Bad(), make_loader())


def test_bad_scheduler_interval(tmp_path):
    class Bad(LinearModule):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {
                "optimizer": opt,
                "lr_scheduler": {
                    "scheduler": torch.optim.lr_scheduler.StepLR(opt, 1),
                    "interval": "batch",
                },
            }

    with pytest.raises(HookResultError, match="interval='batch'; expected 'epoch' or 'step'"):
        quiet_trainer(tmp_path).fit(Bad(), make_loader())


def test_two_optimizers_under_automatic_optimization(tmp_path):
    class Two(LinearModule):
        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.parameters(), lr=0.1),
                torch.optim.SGD(self.parameters(), lr=0.1),
            ]

    with pytest.raises(
        HookResultError,
        match="2 optimizers under automatic optimization.*automatic_optimization = False",
    ):
        quiet_trainer(tmp_path).fit(Two(), make_loader())


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(
        ConfigurationError,
        match=r"strategy='ddpp'.*is not a known strategy\. Expected one of 'auto', 'single'",
    ):
        trainer.Trainer(strategy="ddpp")
    with pytest.raises(ConfigurationError, match="strategy="):
        trainer.Accelerator(strategy="nope")


def test_unknown_precision_lists_the_valid_ones():
    with pytest.raises(ConfigurationError, match=r"precision='fp13'.*'bf16-mixed'.*'16-true'"):
        trainer.Trainer(precision="fp13")
    with pytest.raises(ConfigurationError, match="mixed_precision="):
        trainer.Accelerator(mixed_precision="fp13")


def test_fp8_without_fp8_hardware_says_what_is_needed():
    with pytest.raises(
        ConfigurationError, match=r"compute capability 8\.9.*precision='bf16-mixed'"
    ):
        trainer.Trainer(precision="fp8", accelerator="cpu")


def test_non_dataloader_is_rejected_with_the_argument_name(tmp_path):
    with pytest.raises(
        ConfigurationError,
        match=r"train_dataloaders=\[1, 2, 3\].*not a torch.utils.data.DataLoader.*DataLoader\(dataset",
    ):
        quiet_trainer(tmp_path).fit(LinearModule(), [1, 2, 3])
    with pytest.raises(ConfigurationError, match="val_dataloaders="):
        quiet_trainer(tmp_path).fit(LinearModule(), make_loader(), "data.csv")


def test_missing_train_dataloader(tmp_path):
    with pytest.raises(ConfigurationError, match="no train dataloader.*train_dataloader()"):
        quiet_trainer(tmp_path).fit(LinearModule())


def test_nan_loss_with_detect_anomaly_names_the_hook(tmp_path):
    class NaN(LinearModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if batch_idx == 2 else loss

    with pytest.raises(AnomalyError, match=r"loss is nan \(NaN.training_step, epoch 0, batch 2\)"):
        quiet_trainer(tmp_path, max_epochs=1, detect_anomaly=True).fit(NaN(), make_loader())


def test_nan_gradient_with_detect_anomaly(tmp_path):
    class NaNGrad(LinearModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            out = torch.sqrt(self.net(x) - 1e6)  # negative under sqrt: nan forward and backward
            return (out.nan_to_num() - y).pow(2).mean() + 0 * out.sum().nan_to_num()

    with pytest.raises(AnomalyError, match="nan"):
        quiet_trainer(tmp_path, max_epochs=1, detect_anomaly=True).fit(NaNGrad(), make_loader())


def test_nan_loss_without_detect_anomaly_does_not_raise(tmp_path):
    class NaN(LinearModule):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * float("nan")

    quiet_trainer(tmp_path, max_steps=1).fit(NaN(), make_loader())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"accumulate_grad_batches": 0},
            r"accumulate_grad_batches=0 \(type int\)\): expected an int >= 1",
        ),
        ({"gradient_clip_algorithm": "l2"}, "gradient_clip_algorithm='l2'"),
        ({"gradient_clip_val": -1.0}, "gradient_clip_val=-1.0"),
        ({"val_check_interval": 2.5}, "val_check_interval=2.5"),
        ({"num_sanity_val_steps": 1.5}, "num_sanity_val_steps=1.5"),
        ({"max_time": "12 hours"}, "max_time='12 hours'.*DD:HH:MM:SS"),
        ({"log_every_n_steps": -1}, r"log_every_n_steps=-1.*an int >= 0"),
        ({"fast_dev_run": -1}, "fast_dev_run=-1"),
        ({"accelerator": "tpu"}, "accelerator='tpu'"),
        ({"devices": 4}, r"devices=4.*strategy='ddp'"),
        ({"logger": "csv"}, r"logger=.csv.*expected True, False, a trainer.loggers.Logger"),
        ({"callbacks": [print]}, "not a trainer.callbacks.Callback"),
        ({"seed": -5}, None),
    ],
)
def test_bad_trainer_arguments(tmp_path, kwargs, match):
    if "seed" in kwargs:
        with pytest.raises(ConfigurationError, match=r"seed=-5"):
            quiet_trainer(tmp_path, **kwargs).fit(LinearModule(), make_loader())
        return
    with pytest.raises(ConfigurationError, match=match):
        trainer.Trainer(**kwargs)


def test_log_outside_trainer_and_bad_values(tmp_path):
    with pytest.raises(ConfigurationError, match="outside a Trainer run"):
        LinearModule().log("x", 1.0)

    class BadLog(LinearModule):
        def training_step(self, batch, batch_idx):
            self.log("name", "high")
            return super().training_step(batch, batch_idx)

    with pytest.raises(
        ConfigurationError, match=r"self.log\('name', value\) in training_step: expected a number"
    ):
        quiet_trainer(tmp_path, max_steps=1).fit(BadLog(), make_loader())

    class VectorLog(LinearModule):
        def training_step(self, batch, batch_idx):
            self.log("vec", torch.ones(3))
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigurationError, match=r"shape \(3,\).*value.mean\(\)"):
        quiet_trainer(tmp_path, max_steps=1).fit(VectorLog(), make_loader())


def test_missing_dependency_names_the_extra():
    with pytest.raises(MissingDependencyError, match=r"pip install 'trainer\[wandb\]'"):
        require("a_package_that_does_not_exist_xyz", extra="wandb", feature="WandbLogger")


def test_fit_with_something_that_is_not_a_module(tmp_path):
    with pytest.raises(
        ConfigurationError, match=r"module=.*Linear.*expected a trainer.TrainModule"
    ):
        quiet_trainer(tmp_path).fit(torch.nn.Linear(2, 2), make_loader())


def test_test_without_test_step(tmp_path):
    class NoTest(LinearModule):
        test_step = None

    with pytest.raises(ConfigurationError, match="NoTest has no test_step. Implement test_step"):
        quiet_trainer(tmp_path).test(NoTest(), make_loader())


def test_validate_before_any_fit_without_a_module(tmp_path):
    with pytest.raises(ConfigurationError, match=r"trainer.validate\(\): no module given"):
        quiet_trainer(tmp_path).validate()


def test_a_missing_checkpoint_is_also_what_lightning_and_accelerate_raise(tmp_path):
    """A ported ``except FileNotFoundError`` (Lightning's ckpt_path) or ``except ValueError``
    (Accelerate's load_state) still catches it."""
    from trainer.checkpoint import read_checkpoint

    missing = str(tmp_path / "no" / "such")
    calls = {
        "fit": lambda: quiet_trainer(tmp_path).fit(
            LinearModule(), make_loader(), ckpt_path=missing
        ),
        "load_state": lambda: trainer.Accelerator(cpu=True).load_state(missing),
        "read_checkpoint": lambda: read_checkpoint(missing),
        "load_from_checkpoint": lambda: LinearModule.load_from_checkpoint(missing),
        "a .ckpt file": lambda: quiet_trainer(tmp_path).test(
            LinearModule(), make_loader(), ckpt_path=missing + ".ckpt"
        ),
    }
    for what, call in calls.items():
        with pytest.raises(trainer.CheckpointNotFoundError) as caught:
            call()
        assert isinstance(caught.value, FileNotFoundError | ValueError), what
        assert isinstance(caught.value, trainer.CheckpointError), what
        assert "no" in str(caught.value) and "such" in str(caught.value), what


def test_weights_that_do_not_fit_are_also_what_torch_raises(tmp_path):
    """A ported ``except RuntimeError`` (torch's load_state_dict, through Lightning's
    load_from_checkpoint and ckpt_path, or Accelerate's load_state) still catches it."""

    class Wider(LinearModule):
        def __init__(self, lr: float = 0.05):
            super().__init__(lr)
            self.head = torch.nn.Linear(1, 3)  # weights the checkpoint does not hold

    fit = quiet_trainer(tmp_path / "saved", max_steps=1)
    fit.fit(LinearModule(), make_loader())
    saved = tmp_path / "ck"
    fit.save_checkpoint(saved)
    calls = {
        "load_from_checkpoint": lambda: Wider.load_from_checkpoint(saved),
        "fit": lambda: quiet_trainer(tmp_path / "resumed", max_steps=2).fit(
            Wider(), make_loader(), ckpt_path=saved
        ),
    }
    for what, call in calls.items():
        with pytest.raises(trainer.CheckpointMismatchError) as caught:
            call()
        assert isinstance(caught.value, RuntimeError), what
        assert isinstance(caught.value, trainer.CheckpointError), what
        assert "do not fit Wider" in str(caught.value), what
