"""Parity by difference: a LightningCLI subclass ported to TrainerCLI by changing its import.

The ways a project's ``main.py`` extends LightningCLI: ``add_arguments_to_parser`` (its own
options, ``link_arguments`` at parse and at instantiation, ``set_defaults``),
``before_instantiate_classes`` / ``after_instantiate_classes`` and ``before_<stage>`` /
``after_<stage>``, ``parser_kwargs`` (per-stage ``default_config_files``), a config given as a
dict, ``configure_optimizers`` of the CLI with ``--optimizer Adamax --lr_scheduler StepLR`` by
short name, ``auto_configure_optimizers=False``, ``run=False`` and a ``SaveConfigCallback``
subclass that overrides ``save_config``. Each scenario runs on lightning.pytorch 2.6 and on
trainer; what Lightning did (events, hyperparameters, steps, learning rates, final weights) is
the expected value.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.cli.save_config import SaveConfigCallback
from trainer.cli.trainer_cli import TrainerCLI

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("jsonargparse")
lightning_cli = pytest.importorskip("lightning.pytorch.cli")

QUIET = {
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "logger": False,
    "enable_checkpointing": False,
}
SIDES = {
    "lightning": (
        lightning_cli.LightningCLI,
        lightning_cli.SaveConfigCallback,
        pl.LightningModule,
        pl.LightningDataModule,
        {**QUIET, "accelerator": "cpu"},
    ),
    "trainer": (TrainerCLI, SaveConfigCallback, trainer.TrainModule, trainer.DataModule, QUIET),
}


def _project(module_base: type, data_base: type) -> tuple[type, type]:
    """A DataModule whose ``num_features`` the model must match, and a two-layer regressor."""

    class Data(data_base):  # type: ignore[misc, valid-type]
        def __init__(self, batch_size: int = 4, num_features: int = 3) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.num_features = num_features

        def train_dataloader(self) -> DataLoader:
            x = torch.randn(16, self.num_features, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)

        def val_dataloader(self) -> DataLoader:
            return self.train_dataloader()

    class Net(module_base):  # type: ignore[misc, valid-type]
        def __init__(self, in_features: int = 4, hidden: int = 5, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(in_features, hidden), torch.nn.Linear(hidden, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Net, Data


def _extended(cli_base: type, events: list[Any]) -> type:
    """A project's CLI: an option of its own, two links, a default, and every hook recorded."""

    class ProjectCLI(cli_base):  # type: ignore[misc, valid-type]
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_argument("--notes", type=str, default="none")
            parser.link_arguments("data.num_features", "model.in_features", apply_on="instantiate")
            parser.link_arguments("data.batch_size", "model.hidden")
            parser.set_defaults({"trainer.max_epochs": 2})

        def before_instantiate_classes(self) -> None:
            config = self.config[self.subcommand] if self.subcommand else self.config
            events.append(("before_instantiate_classes", config.notes, config.model.hidden))

        def after_instantiate_classes(self) -> None:
            events.append(("after_instantiate_classes", type(self.trainer).__name__ != ""))

        def before_fit(self) -> None:
            events.append(("before_fit", self.trainer.max_epochs, self.model.hparams.in_features))

        def after_fit(self) -> None:
            events.append(("after_fit", self.trainer.global_step))

        def before_validate(self) -> None:
            events.append(("before_validate", self.trainer.global_step))

        def after_validate(self) -> None:
            events.append(("after_validate",))

    return ProjectCLI


def _outcome(cli: Any) -> dict[str, Any]:
    hparams = {k: v for k, v in dict(cli.model.hparams).items() if k != "_instantiator"}
    weights = torch.cat([p.detach().flatten() for p in cli.model.parameters()])
    return {
        "hparams": hparams,
        "step": cli.trainer.global_step,
        "epoch": cli.trainer.current_epoch,
        "weights": [round(float(w), 5) for w in weights],
    }


def _run(side: str, tmp_path: Path, args: Any, **options: Any) -> dict[str, Any]:
    cli_base, _, module_base, data_base, defaults = SIDES[side]
    net, data = _project(module_base, data_base)
    events: list[Any] = []
    workdir = tmp_path / side
    workdir.mkdir(exist_ok=True)
    # A fraction: in one whole-suite run an int 3 here arrived as 3.0 (jsonargparse tried float
    # first for `int | float | None`; typing caches a Union whose order an earlier test chose).
    (workdir / "fit_defaults.yaml").write_text("trainer:\n  limit_train_batches: 0.75\n")
    options.setdefault("save_config_callback", None)
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.chdir(workdir)
        patch.setattr("sys.argv", ["main.py"])  # LightningCLI warns when both are given
        cli = _extended(cli_base, events)(
            net,
            data,
            args=args,
            seed_everything_default=0,
            trainer_defaults={**defaults, "default_root_dir": str(workdir)},
            parser_kwargs={"fit": {"default_config_files": ["fit_defaults.yaml"]}},
            **options,
        )
    return {"events": events, **_outcome(cli)}


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "--notes", "hello", "--data.batch_size", "2"],
        {"fit": {"notes": "hello", "data": {"batch_size": 2}}},
        ["validate", "--data.num_features", "4"],
    ],
    ids=["argv", "dict", "validate"],
)
def test_a_cli_subclass_runs_as_lightnings(tmp_path: Path, args: Any) -> None:
    expected = _run("lightning", tmp_path, args)
    assert _run("trainer", tmp_path, args) == expected
    if isinstance(args, dict):  # the stage's default_config_files applied: 3 batches an epoch
        assert expected["step"] == 12 and expected["hparams"]["hidden"] == 2


def test_run_false_gives_the_flat_config_and_builds_only(tmp_path: Path) -> None:
    args = ["--notes", "x", "--data.num_features", "2"]
    expected = _run("lightning", tmp_path, args, run=False)
    assert _run("trainer", tmp_path, args, run=False) == expected
    assert expected["step"] == 0 and expected["hparams"]["in_features"] == 2


def _optimizer_cli(cli_base: type, seen: list[Any]) -> type:
    class OptimizerCLI(cli_base):  # type: ignore[misc, valid-type]
        @staticmethod
        def configure_optimizers(module: Any, optimizer: Any, lr_scheduler: Any = None) -> Any:
            seen.append((type(optimizer).__name__, type(lr_scheduler).__name__))
            interval = {"scheduler": lr_scheduler, "interval": "step"}
            return {"optimizer": optimizer, "lr_scheduler": interval}

    return OptimizerCLI


def test_the_clis_configure_optimizers_gets_the_optimizer_and_scheduler_by_short_name(
    tmp_path: Path,
) -> None:
    # Adamax: bitsandbytes (imported by other tests in this process) has its own Adam, SGD,
    # AdamW, Adagrad and RMSprop, which make those short names ambiguous to jsonargparse.
    args = ["fit", "--optimizer", "Adamax", "--optimizer.lr", "0.05"]
    args += ["--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "2"]
    args += ["--trainer.max_epochs", "2"]
    outcomes = {}
    for side, (cli_base, _, module_base, data_base, defaults) in SIDES.items():
        net, data = _project(module_base, data_base)
        seen: list[Any] = []
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
            warnings.simplefilter("ignore")
            patch.chdir(tmp_path)
            cli = _optimizer_cli(cli_base, seen)(
                net,
                data,
                args=[*args, "--model.in_features", "3"],
                seed_everything_default=0,
                trainer_defaults=defaults,
                save_config_callback=None,
            )
        lr = cli.trainer.optimizers[0].param_groups[0]["lr"]
        outcomes[side] = {"seen": seen, "lr": round(lr, 8), **_outcome(cli)}
    assert outcomes["trainer"] == outcomes["lightning"]
    assert outcomes["lightning"]["lr"] == pytest.approx(0.05 * 0.1**4)  # stepped every step


def test_without_auto_configure_optimizers_the_optimizer_key_is_unknown(tmp_path: Path) -> None:
    codes = {}
    for side, (cli_base, _, module_base, data_base, defaults) in SIDES.items():
        net, data = _project(module_base, data_base)
        with pytest.raises(SystemExit) as exit_request, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cli_base(
                net,
                data,
                args=["fit", "--optimizer", "Adamax"],
                trainer_defaults=defaults,
                auto_configure_optimizers=False,
            )
        codes[side] = exit_request.value.code
    assert codes == {"lightning": 2, "trainer": 2}


def test_a_save_config_subclass_records_where_the_project_wants(tmp_path: Path) -> None:
    recorded = {}
    for side, (cli_base, save_base, module_base, data_base, defaults) in SIDES.items():
        net, data = _project(module_base, data_base)
        calls: list[Any] = []

        class Recording(save_base):  # type: ignore[misc, valid-type]
            def save_config(self, trainer_: Any, module: Any, stage: str, calls=calls) -> None:
                calls.append((stage, trainer_.global_step, type(module).__name__))

        workdir = tmp_path / side
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
            warnings.simplefilter("ignore")
            patch.chdir(tmp_path)
            cli_base(
                net,
                data,
                args=["fit", "--trainer.max_epochs", "1", "--model.in_features", "3"],
                trainer_defaults={**defaults, "default_root_dir": str(workdir)},
                save_config_callback=Recording,
                save_config_kwargs={"config_filename": "run.yaml"},
            )
        saved = (workdir / "run.yaml").read_text()
        recorded[side] = (calls, "max_epochs: 1" in saved)
    assert recorded["trainer"] == recorded["lightning"] == ([("fit", 0, "Net")], True)


def _fit_then_validate(
    tmp_path: Path, side: str, validate_args: list[str], **cli_options: Any
) -> tuple[Any, Any]:
    """``fit --model.hidden 3 --model.in_features 3`` for one epoch, then ``validate`` with its
    checkpoint and ``validate_args``; the two CLIs of ``side``."""
    cli_base, _, module_base, data_base, defaults = SIDES[side]
    net, data = _project(module_base, data_base)
    options = {
        "trainer_defaults": {**defaults, "enable_checkpointing": True},
        "save_config_callback": None,
        "seed_everything_default": 0,
        **cli_options,
    }
    (tmp_path / side).mkdir()
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.chdir(tmp_path / side)
        model = ["--model.hidden", "3", "--model.in_features", "3"]
        fitted = cli_base(net, data, args=["fit", *model, "--trainer.max_epochs", "1"], **options)
        path = fitted.trainer.checkpoint_callback.best_model_path
        args = ["validate", "--ckpt_path", path, *validate_args]
        return fitted, cli_base(net, data, args=args, **options)


def test_a_stage_with_ckpt_path_builds_the_model_the_checkpoint_saved(tmp_path: Path) -> None:
    """``fit --model.hidden 3``, then ``validate --ckpt_path <it>`` without the model's options:
    the model is built with the checkpoint's hyperparameters, which win over the options."""
    outcomes = {}
    for side in SIDES:
        _, validated = _fit_then_validate(tmp_path, side, ["--model.hidden", "7"])
        outcomes[side] = {
            "metrics": round(float(validated.trainer.callback_metrics["val_loss"]), 5),
            **_outcome(validated),
        }
    assert outcomes["trainer"] == outcomes["lightning"]
    assert outcomes["lightning"]["hparams"] == {"in_features": 3, "hidden": 3, "lr": 0.1}


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val_loss"],
        ["--trainer.callbacks", "[]"],
    ],
    ids=["none", "appended", "emptied"],
)
def test_callbacks_of_trainer_defaults_are_always_added(tmp_path: Path, extra: list[str]) -> None:
    kept = {}
    for side, (cli_base, _, module_base, data_base, defaults) in SIDES.items():
        net, data = _project(module_base, data_base)
        callback_base = pl.Callback if side == "lightning" else trainer.callbacks.Callback
        persistent = type("Persistent", (callback_base,), {})()
        args = ["fit", "--trainer.max_epochs", "1", "--model.in_features", "3", *extra]
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
            warnings.simplefilter("ignore")
            patch.chdir(tmp_path)
            cli = cli_base(
                net,
                data,
                args=args,
                trainer_defaults={**defaults, "callbacks": [persistent]},
                save_config_callback=None,
            )
        names = [type(c).__name__ for c in cli.trainer.callbacks]
        kept[side] = [name for name in names if name in ("Persistent", "EarlyStopping")]
    assert kept["trainer"] == kept["lightning"]
    assert "Persistent" in kept["lightning"]


@pytest.mark.parametrize("run", [True, False], ids=["fit", "run-false"])
def test_default_env_reads_lightnings_variable_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: bool
) -> None:
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_EPOCHS", "3")
    monkeypatch.setenv("PL_TRAINER__MAX_EPOCHS", "2")
    monkeypatch.setenv("PL_FIT__MODEL__HIDDEN", "6")
    monkeypatch.setenv("PL_MODEL__HIDDEN", "7")
    read = {}
    for side, (cli_base, _, module_base, data_base, defaults) in SIDES.items():
        net, data = _project(module_base, data_base)
        args = ["--model.in_features", "3"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cli = cli_base(
                net,
                data,
                args=["fit", *args] if run else args,
                run=run,
                trainer_defaults=defaults,
                save_config_callback=None,
                parser_kwargs={"default_env": True},
            )
        read[side] = (cli.trainer.max_epochs, cli.model.hparams.hidden, cli.trainer.global_step)
    assert read["trainer"] == read["lightning"]
    assert read["lightning"] == ((3, 6, 12) if run else (2, 7, 0))


def test_a_trainer_subclass_with_its_own_arguments_as_lightnings(tmp_path: Path) -> None:
    """``trainer_class=`` (refused before): the subclass is built, and its own ``__init__``
    argument is a ``--trainer.<arg>`` option beside the Trainer's."""
    outcomes = {}
    for side, (cli_base, _, module_base, data_base, defaults) in SIDES.items():
        net, data = _project(module_base, data_base)
        trainer_base = pl.Trainer if side == "lightning" else trainer.Trainer

        class ReportingTrainer(trainer_base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, report_every: int = 1, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.report_every = report_every

        args = ["--trainer.report_every", "5", "--trainer.max_epochs", "3"]
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
            warnings.simplefilter("ignore")
            patch.chdir(tmp_path)
            cli = cli_base(
                net, data, args=args, run=False, trainer_class=ReportingTrainer,
                trainer_defaults=defaults, save_config_callback=None,
            )  # fmt: skip
        built = cli.trainer
        outcomes[side] = (type(built).__name__, built.report_every, built.max_epochs)
    assert outcomes["trainer"] == outcomes["lightning"] == ("ReportingTrainer", 5, 3)


def test_load_from_checkpoint_support_false_as_lightnings(tmp_path: Path) -> None:
    """``load_from_checkpoint_support=False`` (refused before) runs as in Lightning: the
    hyperparameters are what ``__init__`` received, and ``ckpt_path``'s still win."""
    outcomes = {}
    for side in SIDES:
        fitted, validated = _fit_then_validate(
            tmp_path, side, ["--model.lr", "0.5"], load_from_checkpoint_support=False
        )
        outcomes[side] = [dict(fitted.model.hparams), dict(validated.model.hparams)]
    assert outcomes["trainer"] == outcomes["lightning"]
    assert outcomes["lightning"][1] == {"in_features": 3, "hidden": 3, "lr": 0.1}
