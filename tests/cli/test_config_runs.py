"""Config-driven runs: ``trainer fit|validate|test|predict --config`` and ``TrainerCLI``.

Mirrors ``trainer/cli/trainer_cli.py`` (with ``_config_errors.py`` and the subcommand modules
``fit.py``, ``validate.py``, ``test.py``, ``predict.py``). The models and data the configs name
live in ``tests/cli/fixtures/cli_fixtures.py``; the digits model is ``examples/digits.py``'s.
Real runs are short (a few batches) and go through both a subprocess (the ``trainer`` command,
as a user runs it) and the Python entry points (``run_cli``, ``TrainerCLI``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from tests.conftest import load_module_from_file
from trainer import Trainer
from trainer.cli import main, selfcheck
from trainer.cli import test as test_command
from trainer.cli.trainer_cli import (
    CLI_CONFIG_KEY,
    ConfigArgumentError,
    SaveConfigCallback,
    TrainerCLI,
    run_cli,
)
from trainer.errors import ConfigurationError, MissingDependencyError

pytest.importorskip("jsonargparse")

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
QUIET = {"enable_progress_bar": False, "enable_model_summary": False}
TINY = {
    "seed_everything": 0,
    "trainer": {"max_epochs": 1, "logger": False, **QUIET},
    "model": {"class_path": "cli_fixtures.TinyRegressor"},
    "data": {"class_path": "cli_fixtures.RegressionData"},
}
# Every Trainer argument, as the messages list the keys of `trainer` (sorted).
TRAINER_KEYS = ", ".join(sorted(inspect.signature(Trainer).parameters))


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Configs name ``cli_fixtures.*`` and ``examples.digits.*``; runs write under tmp_path.

    Seeding writes environment variables (the drawn seed, PYTHONHASHSEED); they are put back,
    so later tests' subprocesses do not inherit them.
    """
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.chdir(tmp_path)
    saved = {name: os.environ.get(name) for name in ("TRAINER_CLI_SEED", "PYTHONHASHSEED")}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def write_yaml(path: Path, content: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return path


def trainer_command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m trainer.cli <args>`` in a fresh process, as a user runs it."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), str(FIXTURES), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [sys.executable, "-m", "trainer.cli", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def only_checkpoint(directory: Path) -> Path:
    """The one checkpoint directory the run wrote into ``directory``."""
    found = sorted(directory.iterdir())
    assert len(found) == 1, found
    return found[0]


def load_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


# -- the whole story, through the `trainer` command ---------------------------------------------


def test_saved_config_reproduces_the_run_and_drives_validate_and_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    digits = {
        "seed_everything": 1234,
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 3,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            **QUIET,
        },
        "model": {"class_path": "examples.digits.DigitsClassifier"},
        "data": {"class_path": "cli_fixtures.DigitsData", "init_args": {"batch_size": 32}},
    }
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    write_yaml(first / "run.yaml", digits)

    result = trainer_command(first, "fit", "--config", "run.yaml")
    assert result.returncode == 0, result.stderr
    saved_path = first / "trainer_logs" / "version_0" / "config.yaml"
    saved = yaml.safe_load(saved_path.read_text(encoding="utf-8"))
    # Fully resolved: every Trainer argument and every model argument, defaults included.
    assert set(saved["trainer"]) == set(inspect.signature(Trainer).parameters)
    assert saved["trainer"]["limit_train_batches"] == 3
    assert saved["model"]["init_args"] == {"lr": 0.003, "weight_decay": 0.01, "dropout": 0.25}
    assert saved["seed_everything"] == 1234
    checkpoint = only_checkpoint(first / "checkpoints")
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
    assert state[CLI_CONFIG_KEY] == saved

    result = trainer_command(second, "fit", "--config", str(saved_path))
    assert result.returncode == 0, result.stderr
    again = only_checkpoint(second / "checkpoints")
    assert checkpoint.name == again.name
    weights, weights_again = load_weights(checkpoint), load_weights(again)
    assert weights.keys() == weights_again.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, weights_again[name]), name
    resaved = second / "trainer_logs" / "version_0" / "config.yaml"
    assert resaved.read_text(encoding="utf-8") == saved_path.read_text(encoding="utf-8")

    # validate and test run from the same file, here in-process through the Python entry.
    cli = TrainerCLI(
        args=["validate", "--config", str(saved_path), "--ckpt_path", str(checkpoint)],
        exit_on_error=False,
    )
    val_loss = cli.result[0]["val/loss"]
    assert val_loss == pytest.approx(state["callback_metrics"]["val/loss"], rel=1e-5)
    assert run_cli(["test", "--config", str(saved_path), "--ckpt_path", str(checkpoint)]) == 0
    printed = capsys.readouterr().out
    assert f"val/loss: {val_loss:.6g}" in printed
    assert "test/acc: " in printed and "test/loss: " in printed


def test_bad_key_through_the_command_is_one_line_and_exit_2(tmp_path: Path) -> None:
    write_yaml(tmp_path / "run.yaml", TINY)
    result = trainer_command(tmp_path, "fit", "--config", "run.yaml", "--trainer.max_epoch", "3")
    assert result.returncode == 2
    assert result.stderr == (
        "error: unknown key 'trainer.max_epoch' (did you mean 'trainer.max_epochs'?). Valid keys "
        f"under 'trainer': {TRAINER_KEYS}.\n"
    )
    assert result.stdout == ""
    assert not (tmp_path / "checkpoints").exists()


# -- --print_config and the saved config -------------------------------------------------------


def test_print_config_prints_the_resolved_config_and_does_not_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_yaml(tmp_path / "run.yaml", TINY)
    args = ["fit", "--config", "run.yaml", "--trainer.max_epochs", "3", "--model.lr", "0.01"]
    assert main.main([*args, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == 3
    assert printed["trainer"]["max_time"] is None  # defaults included, nulls too
    assert set(printed["trainer"]) == set(inspect.signature(Trainer).parameters)
    assert printed["model"] == {
        "class_path": "cli_fixtures.TinyRegressor",
        "init_args": {"lr": 0.01, "hidden": 4},
    }
    assert printed["optimizer"] is None and printed["ckpt_path"] is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run.yaml"]


def test_seed_true_is_saved_as_the_seed_drawn(tmp_path: Path) -> None:
    config = {**TINY, "seed_everything": True}
    cli = TrainerCLI(args=["fit", "--config", str(write_yaml(tmp_path / "run.yaml", config))])
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8"))
    assert isinstance(saved["seed_everything"], int)
    assert cli.config.subcommand == "fit"  # LightningCLI's shape: the stage's keys under its name
    assert saved["seed_everything"] == cli.config["fit"].seed_everything
    assert saved["trainer"]["logger"] is False  # logger off: config.yaml is in default_root_dir


def test_callbacks_and_logger_from_class_path_lists(tmp_path: Path) -> None:
    config = {
        **TINY,
        "trainer": {
            "max_epochs": 2,
            **QUIET,
            "callbacks": [
                {"class_path": "EarlyStopping", "init_args": {"monitor": "val/loss"}},
                {"class_path": "trainer.callbacks.ModelCheckpoint", "init_args": {"dirpath": "ck"}},
            ],
            "logger": [{"class_path": "CSVLogger", "init_args": {"save_dir": "logs"}}],
        },
    }
    path = write_yaml(tmp_path / "run.yaml", config)
    cli = TrainerCLI(args=["fit", "--config", str(path)], exit_on_error=False)
    names = [type(callback).__name__ for callback in cli.trainer.callbacks]
    assert {"EarlyStopping", "ModelCheckpoint", "SaveConfigCallback"} <= set(names)
    assert [type(logger).__name__ for logger in cli.trainer.loggers] == ["CSVLogger"]
    saved_path = tmp_path / "logs" / "trainer_logs" / "version_0" / "config.yaml"
    saved = yaml.safe_load(saved_path.read_text(encoding="utf-8"))
    assert saved["trainer"]["callbacks"][0]["class_path"] == "trainer.callbacks.EarlyStopping"
    assert saved["trainer"]["callbacks"][0]["init_args"]["patience"] == 3
    assert saved["trainer"]["logger"][0]["class_path"] == "trainer.loggers.CSVLogger"
    state = json.loads((only_checkpoint(tmp_path / "ck") / "state.json").read_text())
    assert state[CLI_CONFIG_KEY] == saved


def test_save_config_callback_writes_on_global_rank_zero_only(tmp_path: Path) -> None:
    callback = SaveConfigCallback({"a": 1}, "a: 1\n")
    rank_one = SimpleNamespace(is_global_zero=False, log_dir=str(tmp_path / "one"))
    callback.setup(rank_one, None, "fit")  # type: ignore[arg-type]  # a stand-in Trainer
    assert not (tmp_path / "one").exists()
    rank_zero = SimpleNamespace(is_global_zero=True, log_dir=str(tmp_path / "zero"))
    callback.setup(rank_zero, None, "fit")  # type: ignore[arg-type]  # a stand-in Trainer
    assert (tmp_path / "zero" / "config.yaml").read_text(encoding="utf-8") == "a: 1\n"
    checkpoint: dict[str, Any] = {}
    callback.on_save_checkpoint(rank_zero, None, checkpoint)  # type: ignore[arg-type]
    assert checkpoint == {CLI_CONFIG_KEY: {"a": 1}}


# -- optimizer / lr_scheduler shortcuts ---------------------------------------------------------


def test_optimizer_and_lr_scheduler_replace_configure_optimizers(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "run.yaml", {**TINY, "trainer": {**TINY["trainer"], "max_epochs": 2}}
    )
    # Adamax: bitsandbytes (imported by other tests in this process) has its own Adam, SGD,
    # AdamW, Adagrad and RMSprop, which make those short names ambiguous to jsonargparse.
    args = ["fit", "--config", str(path), "--optimizer", "Adamax", "--optimizer.lr", "0.1"]
    args += ["--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "1"]
    with pytest.warns(UserWarning, match="TinyRegressor.configure_optimizers is replaced"):
        cli = TrainerCLI(args=args, exit_on_error=False)
    optimizer = cli.trainer.optimizers[0]
    assert isinstance(optimizer.optimizer, torch.optim.Adamax)
    (config,) = cli.trainer.lr_scheduler_configs
    assert isinstance(config.scheduler, torch.optim.lr_scheduler.StepLR)
    assert config.interval == "epoch"
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1**2)  # stepped twice


def plateau_arguments(tmp_path: Path, class_path: str) -> list[str]:
    path = write_yaml(tmp_path / "run.yaml", TINY)
    args = ["fit", "--config", str(path), "--optimizer", "ASGD", "--optimizer.lr", "0.01"]
    return [*args, "--lr_scheduler", class_path, "--lr_scheduler.monitor", "val/loss"]


@pytest.mark.parametrize(
    ("class_path", "module"),
    [
        ("trainer.cli.trainer_cli.ReduceLROnPlateau", "trainer.cli.trainer_cli"),
        ("lightning.pytorch.cli.ReduceLROnPlateau", "lightning.pytorch.cli"),  # a ported config
    ],
)
def test_reduce_lr_on_plateau_gets_its_monitor(
    tmp_path: Path, class_path: str, module: str
) -> None:
    pytest.importorskip(module)
    with pytest.warns(UserWarning, match="replaced"):
        cli = TrainerCLI(args=plateau_arguments(tmp_path, class_path), exit_on_error=False)
    (config,) = cli.trainer.lr_scheduler_configs
    assert isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert type(config.scheduler).__module__ == module
    assert config.monitor == "val/loss"


def test_torchs_reduce_lr_on_plateau_is_refused_naming_ours(tmp_path: Path) -> None:
    torch_plateau = plateau_arguments(tmp_path, "torch.optim.lr_scheduler.ReduceLROnPlateau")
    with pytest.raises(ConfigurationError, match=r"trainer\.cli\.trainer_cli\.ReduceLROnPlateau"):
        TrainerCLI(args=torch_plateau[:-2], exit_on_error=False)


def test_a_config_mapping_needs_its_stage(tmp_path: Path) -> None:
    given = {"trainer": {"max_epochs": 1}, "model": TINY["model"]}
    with pytest.raises(ConfigArgumentError, match=r"one of fit, validate, test, predict.*'model'"):
        TrainerCLI(args=given, exit_on_error=False)
    with pytest.raises(ConfigArgumentError, match="max_epoch"):  # checked as a file's keys are
        TrainerCLI(args={"fit": {"trainer": {"max_epoch": 1}}}, exit_on_error=False)
    cli = TrainerCLI(args={"subcommand": "fit", "fit": TINY}, exit_on_error=False)
    assert cli.subcommand == "fit" and cli.trainer.current_epoch == 1
    from jsonargparse import Namespace  # LightningCLI takes a parsed Namespace too

    cli = TrainerCLI(args=Namespace(fit=Namespace(TINY)), exit_on_error=False)
    assert cli.subcommand == "fit" and cli.trainer.current_epoch == 1


def test_save_config_overwrite_false_keeps_an_earlier_runs_config(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "run.yaml", TINY)
    TrainerCLI(args=["fit", "--config", str(path)], exit_on_error=False)
    first = (tmp_path / "config.yaml").read_text(encoding="utf-8")
    again = ["fit", "--config", str(path), "--trainer.max_epochs", "2"]
    with pytest.raises(ConfigurationError, match=r"config\.yaml already exists and overwrite"):
        TrainerCLI(args=again, exit_on_error=False, save_config_kwargs={"overwrite": False})
    assert (tmp_path / "config.yaml").read_text(encoding="utf-8") == first
    with pytest.raises(ConfigurationError, match=r"save_config_kwargs=\{'multifile': True\}"):
        TrainerCLI(args=again, exit_on_error=False, save_config_kwargs={"multifile": True})
    TrainerCLI(args=again, exit_on_error=False)  # the default replaces it
    assert "max_epochs: 2" in (tmp_path / "config.yaml").read_text(encoding="utf-8")


def test_lr_scheduler_without_optimizer_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "run.yaml", TINY)
    args = ["fit", "--config", str(path), "--lr_scheduler", "StepLR"]
    assert run_cli([*args, "--lr_scheduler.step_size", "1"]) == 1
    assert capsys.readouterr().err == (
        "error: lr_scheduler (torch.optim.lr_scheduler.StepLR) is set but optimizer is not: add "
        "optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.001}} to the config.\n"
    )


# -- every stage from one file -------------------------------------------------------------------


def test_validate_test_and_predict_run_from_the_same_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(write_yaml(tmp_path / "run.yaml", TINY))
    assert main.main(["fit", "--config", path]) == 0
    checkpoint = str(only_checkpoint(tmp_path / "checkpoints"))
    capsys.readouterr()
    assert main.main(["validate", "--config", path, "--ckpt_path", checkpoint]) == 0
    assert main.main(["test", "--config", path, "--ckpt_path", "last"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["val/loss", "test/loss"]
    cli = TrainerCLI(args=["predict", "--config", path], exit_on_error=False)
    assert len(cli.result) == 2 and cli.result[0].shape == (8, 1)  # 16 held-out points, batch 8


def test_ckpt_path_gives_the_class_path_model_its_saved_hyperparameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wide = {**TINY, "model": {**TINY["model"], "init_args": {"hidden": 6}}}
    assert main.main(["fit", "--config", str(write_yaml(tmp_path / "wide.yaml", wide))]) == 0
    checkpoint = only_checkpoint(tmp_path / "checkpoints")
    path = str(write_yaml(tmp_path / "run.yaml", TINY))  # hidden: the default, 4
    cli = TrainerCLI(args=["validate", "--config", path, "--ckpt_path", str(checkpoint)])
    assert cli.model.hparams.hidden == 6 and cli.model.net[0].out_features == 6
    assert cli.config["validate"].model.init_args.hidden == 6  # and the saved config says so

    state = checkpoint / "state.json"  # a crafted checkpoint is refused before it is used
    text, edits = re.subn(r'"hidden":\s*6\b', '"hidden": 60', state.read_text())
    assert edits >= 1  # the edit took (state.json is compact JSON)
    state.write_text(text)
    capsys.readouterr()
    assert main.main(["validate", "--config", path, "--ckpt_path", str(checkpoint)]) == 1
    assert "state.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("saved", "field"),
    [
        (
            {"class_path": "cli_fixtures.TinyRegressor", "init_args": {"hidden": 3}},
            "['class_path']",
        ),
        ({"hidden": 3, "lr": {"class_path": "os.PathLike"}}, "['lr']['class_path']"),
    ],
)
def test_ckpt_path_hyperparameters_cannot_choose_a_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], saved: dict[str, Any], field: str
) -> None:
    crafted = tmp_path / "crafted.ckpt"  # a Lightning-style file, read with weights_only=True
    torch.save({"hyper_parameters": saved, "state_dict": {}}, crafted)
    path = str(write_yaml(tmp_path / "run.yaml", TINY))
    assert main.main(["validate", "--config", path, "--ckpt_path", str(crafted)]) == 1
    err = capsys.readouterr().err
    assert f"hyper_parameters{field} names a class" in err and "crafted.ckpt" in err


# -- errors: the key, the choices, no traceback ---------------------------------------------------

BAD_INPUTS = {
    "unknown trainer key in a file": (
        {"trainer": {"max_epoch": 3}},
        [],
        "unknown key 'trainer.max_epoch' (did you mean 'trainer.max_epochs'?). Valid keys under "
        f"'trainer': {TRAINER_KEYS}.",
    ),
    "unknown top-level key": (
        {"modle": {"class_path": "cli_fixtures.TinyRegressor"}},
        [],
        "unknown key 'modle' (did you mean 'model'?). Valid keys under the top level: ckpt_path, "
        "data, lr_scheduler, model, optimizer, seed_everything, trainer.",
    ),
    "wrong type on the command line": (
        {},
        ["--trainer.max_epochs", "abc"],
        "wrong type for 'trainer.max_epochs': expected int | None, received 'abc'.",
    ),
    "wrong type in a file": (
        {"trainer": {"max_epochs": [1, 2]}},
        [],
        "wrong type for 'trainer.max_epochs': expected int | None, received [1, 2] (list).",
    ),
    "unknown model argument": (
        {"model": {"class_path": "cli_fixtures.TinyRegressor", "init_args": {"lrr": 0.1}}},
        [],
        "unknown key 'model.init_args.lrr' (did you mean 'model.init_args.lr'?). Valid keys "
        "under 'model.init_args' (cli_fixtures.TinyRegressor): hidden, lr.",
    ),
    "wrong model argument type": (
        {"model": {"class_path": "cli_fixtures.TinyRegressor"}},
        ["--model.lr", "fast"],
        "wrong type for 'model.init_args.lr' (cli_fixtures.TinyRegressor): expected float, "
        "received 'fast'.",
    ),
    "model class that does not exist": (
        {"model": {"class_path": "cli_fixtures.TinyRegresor"}},
        [],
        "'model': cannot import class_path 'cli_fixtures.TinyRegresor' (module 'cli_fixtures' "
        "has no attribute 'TinyRegresor'). Check the dotted path; the current directory and "
        "PYTHONPATH are searched. Valid choices: cli_fixtures.TinyRegressor.",
    ),
    "model argument before the model": (
        {},
        ["--model.lr", "0.1"],
        "unknown key 'model.init_args.lr': 'model' takes class_path and init_args; give the "
        "class first (--model CLASS, or class_path in the config), then its arguments.",
    ),
    "unknown callback argument": (
        {"trainer": {"callbacks": [{"class_path": "EarlyStopping", "init_args": {"monitr": "x"}}]}},
        [],
        "unknown key 'trainer.callbacks.init_args.monitr' (did you mean "
        "'trainer.callbacks.init_args.monitor'?). Valid keys under 'trainer.callbacks.init_args' "
        "(trainer.callbacks.EarlyStopping): check_finite, check_on_train_epoch_end, "
        "divergence_threshold, log_rank_zero_only, min_delta, mode, monitor, patience, "
        "stopping_threshold, strict, verbose.",
    ),
    "ambiguous short class name": (
        {},
        ["--lr_scheduler", "ReduceLROnPlateau"],
        "'lr_scheduler': Multiple subclasses with name ReduceLROnPlateau. Give the full class "
        "path to avoid ambiguity: torch.optim.lr_scheduler.ReduceLROnPlateau, "
        "trainer.cli.trainer_cli.ReduceLROnPlateau.",
    ),
    "missing section file": (
        {},
        ["--trainer", "trainer.yaml"],
        "--trainer 'trainer.yaml': no such YAML file. --trainer takes a file holding the "
        "'trainer' section's keys (or give them in the --config file).",
    ),
    "a positional argument": (
        {},
        ["run.yaml"],
        "unexpected argument 'run.yaml': options are written --<section>.<key> VALUE (e.g. "
        "--trainer.max_epochs 3), config files are given with --config FILE.",
    ),
}


@pytest.mark.parametrize(("content", "extra", "message"), BAD_INPUTS.values(), ids=BAD_INPUTS)
def test_bad_input_names_the_key_and_the_choices(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: dict[str, Any],
    extra: list[str],
    message: str,
) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {"trainer": QUIET, **content})
    if "lightning.pytorch.cli" in sys.modules and message.endswith(".ReduceLROnPlateau."):
        # Its ReduceLROnPlateau (loaded by the LightningCLI parity tests) is a candidate too.
        message = message[:-1] + ", lightning.pytorch.cli.ReduceLROnPlateau."
    assert run_cli(["fit", "--config", str(path), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {message}\n"
    assert captured.out == ""
    with pytest.raises(ConfigArgumentError) as raised:
        TrainerCLI(args=["fit", "--config", str(path), *extra], exit_on_error=False)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("key", "lightning_class", "ours"),
    [
        (
            "callbacks",
            "lightning.pytorch.callbacks.EarlyStopping",
            "trainer.callbacks.EarlyStopping",
        ),
        ("logger", "lightning.pytorch.loggers.CSVLogger", "trainer.loggers.CSVLogger"),
    ],
)
def test_a_ported_configs_lightning_class_names_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, lightning_class: str, ours: str
) -> None:
    pytest.importorskip("lightning.pytorch")
    entry = [{"class_path": lightning_class, "init_args": {}}]
    path = write_yaml(
        tmp_path / "ported.yaml", {**TINY, "trainer": {**TINY["trainer"], key: entry}}
    )
    assert run_cli(["fit", "--config", str(path)]) == 2
    short = ours.rsplit(".", 1)[-1]
    assert (
        f" {lightning_class} is Lightning's class: write {ours} (or its short name {short}) "
        "in a config for trainer. Known classes: "
    ) in capsys.readouterr().err


def test_unknown_logger_class_suggests_the_known_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {"trainer": {"logger": [{"class_path": "CSVLoger"}]}})
    assert run_cli(["fit", "--config", str(path)]) == 2
    message = capsys.readouterr().err
    assert message.startswith(
        "error: 'trainer.logger': no class named 'CSVLoger' (did you mean "
        "'trainer.loggers.CSVLogger'?). Known classes: "
    )
    assert "trainer.loggers.TensorBoardLogger" in message and message.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "config file 'run.yaml' does not exist; pass an existing YAML file to --config."),
        (
            "- 1\n",
            "config file 'run.yaml' must hold a mapping of sections (trainer:, model:, ...) at "
            "its top level; received list.",
        ),
    ],
)
def test_bad_config_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "run.yaml").write_text(content, encoding="utf-8")
    assert run_cli(["fit", "--config", "run.yaml"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        (
            ["--trainer.precision", "17"],
            "error: precision='17' (type str) is not a precision mode.",
        ),
        (
            [
                "--trainer.callbacks+=EarlyStopping",
                "--trainer.callbacks.monitor",
                "val/loss",
                "--trainer.callbacks.mode",
                "low",
            ],
            "error: EarlyStopping(mode='low' (type str)): expected 'min' (lower is better) or 'max'.",
        ),
    ],
)
def test_value_a_constructor_rejects_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], start: str
) -> None:
    path = write_yaml(tmp_path / "run.yaml", TINY)
    assert main.main(["fit", "--config", str(path), *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith(start)
    assert err.count("\n") == 1


def test_missing_model_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["fit", "--trainer.max_epochs", "1"]) == 1
    assert capsys.readouterr().err == (
        "error: no model: set 'model' in the config (model: {class_path: my_project.Net, "
        "init_args: {...}}) or pass --model my_project.Net.\n"
    )


def test_subcommand_is_required_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli([], prog="main.py") == 2
    assert run_cli(["train"], prog="main.py") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: main.py: a subcommand is required, one of fit, validate, test, predict "
        "(e.g. main.py fit --config run.yaml).",
        "error: main.py: unknown subcommand 'train'; expected one of fit, validate, test, predict.",
    ]


def test_missing_jsonargparse_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jsonargparse", None)  # makes `import jsonargparse` fail
    with pytest.raises(MissingDependencyError, match=r"pip install 'trainer\[cli\]'"):
        TrainerCLI(args=["fit"], exit_on_error=False)


# -- the Python entry and the command's plumbing -------------------------------------------------


def test_trainer_cli_with_classes_and_run_false(tmp_path: Path) -> None:
    from cli_fixtures import RegressionData, TinyRegressor

    cli = TrainerCLI(
        TinyRegressor,
        RegressionData,
        args=["--model.lr", "0.2", "--data.batch_size", "4", "--trainer.max_epochs", "1"],
        run=False,
        trainer_defaults={"logger": False, **QUIET},
        seed_everything_default=3,
    )
    assert cli.subcommand is None and cli.result is None
    assert cli.model.hparams.lr == 0.2 and cli.datamodule.batch_size == 4
    assert "class_path" not in cli.config_text  # model.<arg> keys, no class_path
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 12  # 48 training points in batches of 4
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["seed_everything"] == 3


def test_stage_help_lists_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["fit", "--help"]) == 0
    printed = capsys.readouterr().out
    for option in ("--config", "--print_config", "--trainer.max_epochs", "--model", "--ckpt_path"):
        assert option in printed


def test_class_in_the_current_directory_is_importable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "local_model.py").write_text(
        "from cli_fixtures import TinyRegressor\n\nclass Local(TinyRegressor):\n    pass\n",
        encoding="utf-8",
    )
    assert main.main(["fit", "--model", "local_model.Local", "--print_config"]) == 0
    assert "class_path: local_model.Local" in capsys.readouterr().out


def test_test_without_a_run_config_is_the_selfcheck(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str | None] = []

    def fake_selfcheck(args: argparse.Namespace) -> int:
        calls.append(args.config_file)
        return 0

    monkeypatch.setattr(selfcheck, "run", fake_selfcheck)
    assert main.main(["test"]) == 0
    assert main.main(["test", "--config_file", "ddp.yaml"]) == 0
    assert main.main(["test", "--config_file=fsdp.yaml"]) == 0
    assert calls == [None, "ddp.yaml", "fsdp.yaml"]
    assert not test_command.is_selfcheck(["--config", "run.yaml"])


def test_cli_reference_page_is_up_to_date() -> None:
    generator = load_module_from_file(REPO_ROOT / "scripts" / "gen_cli_reference.py")
    assert generator.main(["--check"]) == 0, (
        "docs/cli.md is stale: run `python scripts/gen_cli_reference.py`"
    )


def test_parser_class_builds_the_parser_and_trainer_class_is_checked(tmp_path: Path) -> None:
    import jsonargparse

    class RecordingParser(jsonargparse.ArgumentParser):
        built = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            RecordingParser.built += 1

    config = write_yaml(tmp_path / "run.yaml", TINY)
    cli = TrainerCLI(args=["--config", str(config)], run=False, parser_class=RecordingParser)
    assert isinstance(cli.parser, RecordingParser) and RecordingParser.built >= 1
    with pytest.raises(ConfigurationError, match=r"TrainerCLI\(trainer_class=.*expected Trainer"):
        TrainerCLI(args=["--config", str(config)], run=False, trainer_class=dict)
