"""The jsonargparse parser of a config-driven run: build it, parse with clear errors, dump.

This module owns the keys of a run of ``trainer fit|validate|test|predict`` and ``TrainerCLI``:
``--config`` files (checked to exist and hold a YAML mapping, naming the file otherwise),
``seed_everything``, ``trainer`` (the Trainer's signature), ``model`` and ``data`` (a given class's
arguments, or any subclass by ``class_path``), the ``optimizer`` / ``lr_scheduler`` shortcuts
(kept as ``class_path`` + ``init_args``: the CLI builds them once the model exists) and
``ckpt_path``; parsing into a jsonargparse Namespace, instantiating it, and dumping it back to
YAML with every key written. ``--print_config`` is jsonargparse's, added with ``--config``.

It does not own what is done with the parsed config (``trainer/cli/trainer_cli.py``) nor the
wording of parse errors (``trainer/cli/_config_errors.py``). jsonargparse is imported only here,
and only when a parser is built.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer._imports import require
from trainer.cli._config_errors import explain_parse_error
from trainer.errors import ConfigurationError
from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.trainer import Trainer

__all__ = [
    "STAGES",
    "STAGE_HELP",
    "ConfigArgumentError",
    "build_config_parser",
    "dump_config",
    "instantiate_classes",
    "parse_config",
    "parse_config_object",
]

STAGES = ("fit", "validate", "test", "predict")
STAGE_HELP = {
    "fit": "train a model from a YAML config (--config run.yaml [--trainer.max_epochs 3 ...])",
    "validate": "run one validation epoch from a YAML config",
    "test": "run one test epoch from a YAML config",
    "predict": "run predict_step over the data from a YAML config",
}
# Base classes whose public subclasses are imported before parsing, so a config may name them
# by their short name ("EarlyStopping", "CSVLogger") as LightningCLI allows.
_SHORT_NAME_PACKAGES = (
    "trainer.callbacks",
    "trainer.loggers",
    "trainer.strategies",
    "trainer.precision",
)


class ConfigArgumentError(ConfigurationError):
    """The config or an option does not fit the parser: unknown key, wrong type, bad class path.

    The command exits with status 2 (a usage error), as argparse does for a bad option.
    """


def build_config_parser(
    stage: str | None,
    *,
    model_class: type[TrainModule] | None = None,
    datamodule_class: type[DataModule] | None = None,
    subclass_mode_model: bool = False,
    subclass_mode_data: bool = False,
    trainer_defaults: Mapping[str, Any] | None = None,
    seed_everything_default: bool | int = True,
    auto_configure_optimizers: bool = True,
    prog: str | None = None,
    parser_kwargs: Mapping[str, Any] | None = None,
    trainer_class: type[Trainer] = Trainer,
    parser_class: type | None = None,
) -> Any:
    """The jsonargparse parser of a run of ``stage`` (None: no subcommand, no ``ckpt_path``).

    ``auto_configure_optimizers=False`` leaves out the ``optimizer`` / ``lr_scheduler`` keys;
    ``parser_kwargs`` go to ``parser_class`` (default ``jsonargparse.ArgumentParser``:
    ``default_config_files``, ``default_env``, ...), except ``exit_on_error``: errors are always
    raised, then explained. The ``trainer`` keys are ``trainer_class``'s arguments.

    Returns:
        A ``jsonargparse.ArgumentParser`` that raises ``argparse.ArgumentError`` on bad input.

    Raises:
        MissingDependencyError: jsonargparse is not installed.
    """
    jsonargparse = require("jsonargparse", extra="cli", feature="trainer fit/validate/test/predict")
    _import_short_name_classes()
    options = {
        "prog": prog or (f"trainer {stage}" if stage else "trainer"),
        "description": STAGE_HELP.get(stage or "", "Build a run from a YAML config.") + ".",
        "allow_abbrev": False,  # --trainer.max_epoch must be an error, not --trainer.max_epochs
        # With default_env=True, LightningCLI's variable names: PL_FIT__TRAINER__MAX_EPOCHS.
        "env_prefix": f"PL_{stage}_" if stage else "PL",
        **(parser_kwargs or {}),
    }
    options["exit_on_error"] = False
    parser = (parser_class or jsonargparse.ArgumentParser)(**options)
    parser.add_argument(
        "-c",
        "--config",
        action=jsonargparse.ActionConfigFile,
        help="a YAML config file; several are merged in order, and options after it override it",
    )
    parser.add_argument(
        "--seed_everything",
        type=bool | int,
        default=seed_everything_default,
        help="seed for python, numpy and torch before anything is built; true draws one and "
        "writes it into the saved config, false does not seed",
    )
    parser.add_class_arguments(
        trainer_class, "trainer", instantiate=False, fail_untyped=False, sub_configs=True
    )
    if trainer_defaults:
        parser.set_defaults({f"trainer.{key}": value for key, value in trainer_defaults.items()})
    _add_module_arguments(parser, "model", model_class, TrainModule, subclass_mode_model)
    _add_module_arguments(parser, "data", datamodule_class, DataModule, subclass_mode_data)
    if auto_configure_optimizers:
        _add_optimizer_arguments(parser)
    if stage is not None:
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help='checkpoint to start from: a path, "last" or "best" (see docs/checkpointing.md)',
        )
    return parser


def _add_optimizer_arguments(parser: Any) -> None:
    """The ``optimizer`` and ``lr_scheduler`` keys (``class_path`` + ``init_args``)."""
    parser.add_subclass_arguments(
        torch.optim.Optimizer,
        "optimizer",
        skip={"params"},
        instantiate=False,
        required=False,
        help="replaces the model's configure_optimizers: class_path + init_args (params are "
        "the model's)",
    )
    parser.add_subclass_arguments(
        torch.optim.lr_scheduler.LRScheduler,
        "lr_scheduler",
        skip={"optimizer"},
        instantiate=False,
        required=False,
        help="stepped every epoch; needs optimizer: class_path + init_args",
    )


def dump_config(parser: Any, config: Any) -> str:
    """The parsed ``config`` as YAML, every key written (None values included)."""
    import jsonargparse

    major, minor = (int(part) for part in jsonargparse.__version__.split(".")[:2])
    # jsonargparse 4.49 renamed skip_none to skip_unset (the old name warns).
    keep_none = {"skip_unset": False} if (major, minor) >= (4, 49) else {"skip_none": False}
    return parser.dump(config, **keep_none)


def parse_config(parser: Any, arguments: Sequence[str]) -> Any:
    """``parser.parse_args(arguments)``, with errors that name the key and the choices.

    Raises:
        ConfigArgumentError: a config file is missing or not a YAML mapping, or a key or value
            does not fit the parser.
    """
    for path in _config_paths(arguments):
        _check_config_file(path)
    try:
        return parser.parse_args(list(arguments))
    except argparse.ArgumentError as err:
        raise ConfigArgumentError(explain_parse_error(str(err), parser)) from err


def parse_config_object(
    parser: Any, config: Mapping[str, Any], base: Any = None, *, source: str = ""
) -> Any:
    """``parser.parse_object(config, base)``: a config given as a mapping (merged onto the
    parsed ``base``), checked as a file's is; ``source`` says where it came from.

    Raises:
        ConfigArgumentError: a key or value does not fit the parser.
    """
    try:
        return parser.parse_object(dict(config), base)
    except argparse.ArgumentError as err:
        raise ConfigArgumentError(source + explain_parse_error(str(err), parser)) from err


def _add_module_arguments(
    parser: Any, key: str, given: type | None, base: type, subclass_mode: bool
) -> None:
    """``model``/``data``: the given class's arguments, or any subclass by ``class_path``."""
    if given is not None and not subclass_mode:
        parser.add_class_arguments(given, key, fail_untyped=False, sub_configs=True)
        return
    parser.add_subclass_arguments(
        given or base,
        key,
        required=False,
        help=f"the {base.__name__}: class_path (any subclass, by dotted path) + init_args",
    )


def _import_short_name_classes() -> None:
    """Import the framework's lazily exported classes, so configs may use their short names."""
    for package_name in _SHORT_NAME_PACKAGES:
        package = importlib.import_module(package_name)
        for name in getattr(package, "__all__", ()):
            try:
                getattr(package, name)
            except ImportError:  # an optional engine's package is missing: not offered
                continue


def instantiate_classes(parser: Any, config: Any) -> Any:
    """Build the classes of ``config`` (jsonargparse's ``instantiate``; before 4.49
    ``instantiate_classes``).

    Raises:
        Exception: what a constructor raised, as it raised it: jsonargparse wraps it in a
            ValueError listing every type of the argument, which hides the one message that
            matters (a TrainerError's is printed on one line by the command).
    """
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    try:
        return instantiate(config)
    except (ValueError, TypeError) as err:
        cause: BaseException = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if cause is err:
            raise
        raise cause from None


def _config_paths(arguments: Sequence[str]) -> list[str]:
    """The files given to ``-c``/``--config`` in ``arguments``."""
    paths = []
    for index, token in enumerate(arguments):
        if token.startswith("--config="):
            paths.append(token.split("=", 1)[1])
        elif token in ("-c", "--config") and index + 1 < len(arguments):
            paths.append(arguments[index + 1])
    return paths


def _check_config_file(path: str) -> None:
    """A config file must exist and hold a YAML mapping; say which file when it does not."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise ConfigArgumentError(
            f"config file {path!r} does not exist; pass an existing YAML file to --config."
        ) from err
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigArgumentError(
            f"config file {path!r} could not be read ({err}); pass a readable UTF-8 YAML file "
            "to --config."
        ) from err
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ConfigArgumentError(
            f"config file {path!r} is not valid YAML ({detail}); fix the file."
        ) from err
    if content is not None and not isinstance(content, dict):
        raise ConfigArgumentError(
            f"config file {path!r} must hold a mapping of sections (trainer:, model:, ...) at "
            f"its top level; received {type(content).__name__}."
        )
