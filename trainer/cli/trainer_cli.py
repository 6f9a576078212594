"""Config-driven runs: ``trainer fit|validate|test|predict --config run.yaml``, and ``TrainerCLI``.

This module owns what is done with a run described by YAML files and ``--section.key value``
options (the LightningCLI shape, built on jsonargparse):

- seeding (``seed_everything``), then building model, data and Trainer from the parsed config,
  and replacing the module's ``configure_optimizers`` when ``optimizer`` / ``lr_scheduler``
  are given; then running the stage (``fit``, ``validate``, ``test``, ``predict``);
- recording the fully resolved config (`SaveConfigCallback`): ``<log_dir>/config.yaml``
  on global rank 0 at the start of every run, and the key ``cli_config`` of every checkpoint,
  so ``trainer fit --config <log_dir>/config.yaml`` runs the same job again;
- the Python entry points: `TrainerCLI` (for a user's own ``main.py``) and
  `run_cli` (returns the exit status, like ``trainer.cli.main.main``);
- the glue of the ``trainer <stage>`` subcommands (`add_stage_parser`, `run_stage`),
  which the modules ``fit.py``, ``validate.py``, ``test.py`` and ``predict.py`` register.

It does not own the keys of a run and their parsing (``trainer/cli/_config_parser.py``), the
wording of parse errors (``trainer/cli/_config_errors.py``), the ``trainer`` command's own
parser (``trainer/cli/main.py``), the Trainer, or the checkpoint format.

jsonargparse is imported only when a parser is built; without it a run raises
``MissingDependencyError`` naming ``pip install 'trainer[cli]'``.

Examples:
    A ``run.yaml``::

        seed_everything: 0
        trainer: {max_epochs: 3, limit_train_batches: 10}
        model:
          class_path: my_project.models.Net
          init_args: {hidden: 64}
        data:
          class_path: my_project.data.Digits
        optimizer:
          class_path: torch.optim.AdamW
          init_args: {lr: 0.001}

    and ``trainer fit --config run.yaml --trainer.max_epochs 5`` trains 5 epochs; the resolved
    config lands in ``trainer_logs/version_0/config.yaml``.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import random
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from trainer.callbacks.callback import Callback
from trainer.cli._config_parser import (
    STAGE_HELP,
    STAGES,
    ConfigArgumentError,
    build_config_parser,
    dump_config,
    instantiate_classes,
    parse_config,
)
from trainer.errors import ConfigurationError, TrainerError, describe
from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.trainer import Trainer

__all__ = [
    "CLI_CONFIG_KEY",
    "STAGES",
    "ConfigArgumentError",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
    "TrainerCLI",
    "add_stage_parser",
    "run_cli",
    "run_stage",
    "stage_arguments",
]

CLI_CONFIG_KEY = "cli_config"  # the checkpoint key holding the resolved config
CONFIG_FILENAME = "config.yaml"
_ARGS_DEST = "config_args"  # where the argparse subcommand keeps the tokens for jsonargparse
_MAX_SEED = 2**32 - 1
_SEED_ENV = "TRAINER_CLI_SEED"  # a drawn seed, for the processes a relaunch starts


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau plus ``monitor``, the metric it watches (for ``lr_scheduler``).

    Examples:
        In a config (the full path: torch's class has the same short name)::

            lr_scheduler:
              class_path: trainer.cli.trainer_cli.ReduceLROnPlateau
              init_args: {monitor: val/loss, patience: 2}
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        monitor: str,
        mode: Literal["min", "max"] = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: Literal["rel", "abs"] = "rel",
        cooldown: int = 0,
        min_lr: float | list[float] = 0.0,
        eps: float = 1e-8,
    ) -> None:
        super().__init__(
            optimizer,
            mode=mode,
            factor=factor,
            patience=patience,
            threshold=threshold,
            threshold_mode=threshold_mode,
            cooldown=cooldown,
            min_lr=min_lr,
            eps=eps,
        )
        self.monitor = monitor


class SaveConfigCallback(Callback):
    """Write the resolved config to ``<log_dir>/config.yaml`` and into every checkpoint.

    On global rank 0, at ``setup`` of every stage, the YAML text goes to
    ``<trainer.log_dir>/<config_filename>`` (an existing file there is replaced: with the
    default logger each run has its own ``version_<N>`` folder). Every checkpoint gets the config
    as a mapping under the key ``cli_config``.

    Args:
        config: the resolved config, as a mapping of plain values (what ``yaml.safe_load`` of
            ``config_text`` gives).
        config_text: the same config as YAML text.
        config_filename: the file name inside the log directory.

    Examples:
        >>> callback = SaveConfigCallback({"trainer": {"max_epochs": 1}}, "trainer:\\n  max_epochs: 1\\n")
        >>> Trainer(callbacks=[callback]).fit(module)  # doctest: +SKIP
        >>> # trainer_logs/version_0/config.yaml now holds the config
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        config_text: str,
        *,
        config_filename: str = CONFIG_FILENAME,
    ) -> None:
        self.config = copy.deepcopy(dict(config))
        self.config_text = config_text
        self.config_filename = config_filename

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """Write the config file next to the logs (global rank 0 only)."""
        if not trainer.is_global_zero:
            return
        from trainer.checkpoint.atomic import atomic_write_text

        directory = Path(trainer.log_dir)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / self.config_filename, self.config_text)

    def on_save_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None:
        """Put the config in the checkpoint under ``cli_config``."""
        checkpoint[CLI_CONFIG_KEY] = copy.deepcopy(self.config)


class TrainerCLI:
    """Parse a run's config and options, build model, data and Trainer, and run the stage.

    LightningCLI's shape: ``TrainerCLI(MyModel, MyData)`` in a ``main.py`` gives
    ``python main.py fit --config run.yaml --model.lr 0.01``. Without classes, ``model`` and
    ``data`` take any subclass by ``class_path`` (what ``trainer fit`` does).

    Args:
        model_class: the TrainModule class; its ``__init__`` arguments become ``model.<arg>``.
            None: ``model`` takes ``class_path`` + ``init_args`` of any TrainModule subclass.
        datamodule_class: the same for ``data`` and DataModule.
        args: the arguments (the subcommand first when ``run``); None reads ``sys.argv[1:]``.
        run: run the subcommand (``fit``, ``validate``, ``test``, ``predict``); with False
            there is no subcommand and no ``ckpt_path``: the objects are built, and the caller
            runs them (``cli.trainer.fit(cli.model, datamodule=cli.datamodule)``).
        trainer_defaults: Trainer arguments that replace the Trainer's defaults.
        seed_everything_default: ``seed_everything`` when the config does not set it; True
            draws a seed, written into the saved config so the run can be repeated.
        subclass_mode_model: with ``model_class``, accept its subclasses by ``class_path``.
        subclass_mode_data: the same for ``datamodule_class``.
        save_config: record the resolved config (``SaveConfigCallback``).
        exit_on_error: print ``error: <message>`` and exit (status 2 for a parse error, 1 for
            another TrainerError) instead of raising, as a command should.
        prog: the program name in help and errors (default: the script's name).

    Attributes:
        subcommand: the stage that ran: "fit", "validate", "test" or "predict".
        parser: the jsonargparse parser.
        config: the parsed jsonargparse Namespace.
        config_text: the resolved config as YAML.
        model: the TrainModule built from ``model``.
        datamodule: the DataModule built from ``data``, if any.
        trainer: the Trainer built from ``trainer``.
        result: what the stage returned.

    Raises:
        ConfigArgumentError: an unknown key, a wrong type or a bad class path (when
            ``exit_on_error`` is False).
        TrainerError: the objects could not be built or the run failed (same condition).

    Examples:
        >>> cli = TrainerCLI(Net, args=["fit", "--trainer.max_epochs", "2", "--model.lr", "0.1"])
        ...  # doctest: +SKIP
        >>> cli.trainer.current_epoch  # doctest: +SKIP
        2
    """

    def __init__(
        self,
        model_class: type[TrainModule] | None = None,
        datamodule_class: type[DataModule] | None = None,
        *,
        args: Sequence[str] | None = None,
        run: bool = True,
        trainer_defaults: Mapping[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        save_config: bool = True,
        exit_on_error: bool = True,
        prog: str | None = None,
    ) -> None:
        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.subclass_mode_model = subclass_mode_model
        self.subclass_mode_data = subclass_mode_data
        self.save_config = save_config
        self.prog = prog or Path(sys.argv[0]).name or "trainer"
        self.subcommand: str | None = None
        self.parser: Any = None
        self.config: Any = None
        self.config_text = ""
        self.model: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.trainer: Trainer | None = None
        self.result: Any = None
        arguments = list(sys.argv[1:] if args is None else args)
        try:
            self._main(arguments, run)
        except TrainerError as err:
            if not exit_on_error:
                raise
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2 if isinstance(err, ConfigArgumentError) else 1) from None

    def _main(self, arguments: list[str], run: bool) -> None:
        """Parse, seed, build, and (with ``run``) run: the whole life of a config-driven run."""
        if run:
            arguments = self._take_subcommand(arguments)
        self.parser = build_config_parser(
            self.subcommand,
            model_class=self.model_class,
            datamodule_class=self.datamodule_class,
            subclass_mode_model=self.subclass_mode_model,
            subclass_mode_data=self.subclass_mode_data,
            trainer_defaults=self.trainer_defaults,
            seed_everything_default=self.seed_everything_default,
            prog=f"{self.prog} {self.subcommand}" if self.subcommand else self.prog,
        )
        self.config = parse_config(self.parser, arguments)
        # Seed before anything is built, so the initial weights follow the seed too.
        self.config.seed_everything = _seed(self.config.seed_everything)
        self.config_text = dump_config(self.parser, self.config)
        self.trainer = self._instantiate()
        if run:
            self.result = self._run_subcommand(self.trainer)

    def _take_subcommand(self, arguments: list[str]) -> list[str]:
        """Split off ``fit``/``validate``/``test``/``predict``; answer ``--help`` for the script."""
        choices = ", ".join(STAGES)
        if arguments and arguments[0] in ("-h", "--help"):
            print(f"usage: {self.prog} {{{','.join(STAGES)}}} [--config FILE] [--print_config] ...")
            print()
            for stage in STAGES:
                print(f"  {stage:<10}{STAGE_HELP[stage]}")
            print(f"\nSee '{self.prog} <subcommand> --help' for the keys of a run.")
            raise SystemExit(0)
        if not arguments:
            raise ConfigArgumentError(
                f"{self.prog}: a subcommand is required, one of {choices} "
                f"(e.g. {self.prog} fit --config run.yaml)."
            )
        if arguments[0] not in STAGES:
            raise ConfigArgumentError(
                f"{self.prog}: unknown subcommand {arguments[0]!r}; expected one of {choices}."
            )
        self.subcommand = arguments[0]
        return arguments[1:]

    def _instantiate(self) -> Trainer:
        """Build model and data (set on ``self``) and the Trainer (returned) from the config."""
        built = instantiate_classes(self.parser, self.config)
        self.model = built.model
        if self.model is None:
            raise ConfigurationError(
                "no model: set 'model' in the config (model: {class_path: my_project.Net, "
                "init_args: {...}}) or pass --model my_project.Net."
            )
        self.datamodule = built.data
        if self.config.optimizer is not None or self.config.lr_scheduler is not None:
            _replace_configure_optimizers(
                self.model, self.config.optimizer, self.config.lr_scheduler
            )
        trainer_kwargs = {
            key: value for key, value in vars(built.trainer).items() if not key.startswith("__")
        }
        if self.save_config:
            import yaml  # a dependency of trainer; imported here to keep `import trainer` light

            callback = SaveConfigCallback(yaml.safe_load(self.config_text), self.config_text)
            callbacks = trainer_kwargs.get("callbacks")
            if isinstance(callbacks, Callback):
                callbacks = [callbacks]
            trainer_kwargs["callbacks"] = [*(callbacks or []), callback]
        return Trainer(**trainer_kwargs)

    def _run_subcommand(self, trainer: Trainer) -> Any:
        """``trainer.<stage>(model, datamodule=..., ckpt_path=...)``; print eval metrics."""
        method = getattr(trainer, str(self.subcommand))
        options = {"verbose": False} if self.subcommand in ("validate", "test") else {}
        result = method(
            self.model, datamodule=self.datamodule, ckpt_path=self.config.ckpt_path, **options
        )
        if self.subcommand in ("validate", "test") and trainer.is_global_zero:
            for metrics in result:  # one dict per dataloader
                for name, value in sorted(metrics.items()):
                    print(f"{name}: {value:.6g}")
        return result


def run_cli(
    args: Sequence[str] | None = None,
    *,
    model_class: type[TrainModule] | None = None,
    datamodule_class: type[DataModule] | None = None,
    prog: str | None = None,
) -> int:
    """Run ``TrainerCLI`` as a command and return its exit status instead of exiting.

    Args:
        args: the subcommand and its options, e.g. ``["fit", "--config", "run.yaml"]``.
        model_class, datamodule_class: as for `TrainerCLI`.
        prog: the program name in help and errors.

    Returns:
        0 on success and after ``--help`` / ``--print_config``; 2 for an unknown key, a wrong
        type or a bad class path; 1 for another TrainerError. Errors are printed as
        ``error: <message>`` on stderr.

    Examples:
        >>> run_cli(["fit", "--config", "run.yaml", "--trainer.max_epochs", "1"])  # doctest: +SKIP
        0
    """
    try:
        TrainerCLI(model_class, datamodule_class, args=args, exit_on_error=True, prog=prog)
    except SystemExit as exit_request:
        code = exit_request.code
        return code if isinstance(code, int) else 0 if code is None else 1
    return 0


# ---- the `trainer <stage>` subcommands ---------------------------------------------------------
def add_stage_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    stage: str,
    *,
    help_text: str | None = None,
) -> argparse.ArgumentParser:
    """Register ``trainer <stage>``: every token after it goes to the jsonargparse parser.

    The subparser has no options of its own (its prefix character is one no option uses), so
    ``--config``, ``--print_config``, ``--help`` and ``--trainer.max_epochs`` all reach
    `build_config_parser`'s parser, which documents them.

    Args:
        subparsers: the ``trainer`` command's subparsers.
        stage: "fit", "validate", "test" or "predict".
        help_text: the line ``trainer --help`` shows (default: the stage's own).
    """
    summary = help_text or STAGE_HELP[stage]
    parser = subparsers.add_parser(
        stage,
        help=summary,
        description=f"{summary}. See 'trainer {stage} --help'.",
        usage=f"trainer {stage} [--config FILE] [--print_config] [--<section>.<key> VALUE ...]",
        add_help=False,
        prefix_chars="\x00",
    )
    parser.add_argument(_ARGS_DEST, nargs=argparse.REMAINDER)
    return parser


def run_stage(stage: str, args: argparse.Namespace) -> int:
    """Run ``trainer <stage> ...``: the current directory is importable, as with ``python -m``."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return run_cli([stage, *getattr(args, _ARGS_DEST)], prog="trainer")


def stage_arguments(args: argparse.Namespace) -> list[str]:
    """The tokens ``trainer <stage>`` received after the subcommand name."""
    return list(getattr(args, _ARGS_DEST))


def _seed(value: bool | int) -> bool | int:
    """Apply ``seed_everything``: an int seeds, True draws a seed (returned), False does not.

    A drawn seed is also put in the environment, so the processes a Trainer starts for
    ``devices=N`` (which parse the same command again) use the same seed.
    """
    from trainer.runtime.seed import seed_everything
    from trainer.strategies import detect_environment

    if value is False:
        return False
    seed = value
    if value is True:
        inherited = os.environ.get(_SEED_ENV) if detect_environment().is_distributed else None
        seed = int(inherited) if inherited else random.SystemRandom().randint(0, _MAX_SEED)
        os.environ[_SEED_ENV] = str(seed)
    return seed_everything(seed)


def _replace_configure_optimizers(module: TrainModule, optimizer: Any, scheduler: Any) -> None:
    """Make ``module.configure_optimizers`` build the config's optimizer and scheduler."""
    if optimizer is None:
        raise ConfigurationError(
            f"lr_scheduler ({scheduler.class_path}) is set but optimizer is not: add "
            "optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.001}} to the config."
        )
    optimizer_class = _import_class(optimizer.class_path, "optimizer")
    scheduler_class = (
        None if scheduler is None else _import_class(scheduler.class_path, "lr_scheduler")
    )
    if (
        scheduler_class is not None
        and issubclass(scheduler_class, torch.optim.lr_scheduler.ReduceLROnPlateau)
        and not issubclass(scheduler_class, ReduceLROnPlateau)
    ):
        raise ConfigurationError(
            f"lr_scheduler {scheduler.class_path} needs a metric to watch: use class_path: "
            "trainer.cli.trainer_cli.ReduceLROnPlateau with init_args.monitor (e.g. val/loss)."
        )
    if "configure_optimizers" in vars(type(module)):
        warnings.warn(
            f"{type(module).__name__}.configure_optimizers is replaced by the config's optimizer"
            f"{' and lr_scheduler' if scheduler is not None else ''}.",
            stacklevel=3,
        )

    def configure_optimizers(self: TrainModule) -> Any:
        built = optimizer_class(self.parameters(), **_init_args(optimizer))
        if scheduler_class is None:
            return built
        stepper = scheduler_class(built, **_init_args(scheduler))
        entry: dict[str, Any] = {"scheduler": stepper, "interval": "epoch"}
        if getattr(stepper, "monitor", None):
            entry["monitor"] = stepper.monitor
        return {"optimizer": built, "lr_scheduler": entry}

    # An instance attribute: the class (and other instances of it) keep their own method.
    module.configure_optimizers = types.MethodType(configure_optimizers, module)  # type: ignore[method-assign]  # the CLI's replacement, by design


def _init_args(section: Any) -> dict[str, Any]:
    init_args = getattr(section, "init_args", None)
    return {} if init_args is None else dict(init_args.as_dict())


def _import_class(class_path: str, key: str) -> type:
    """The class at ``class_path`` (already checked by the parser when it parsed)."""
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigurationError(
            f"{key}.class_path {class_path!r} could not be imported ({describe(err)})."
        ) from err
