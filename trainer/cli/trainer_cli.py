"""Config-driven runs: ``trainer fit|validate|test|predict --config run.yaml``, and ``TrainerCLI``.

This module owns what is done with a run described by YAML files and ``--section.key value``
options (the LightningCLI shape, built on jsonargparse):

- the order of a run (`TrainerCLI`): parse, seed, build model, data and Trainer from the
  parsed config, run the stage (``fit``, ``validate``, ``test``, ``predict``), with
  LightningCLI's methods for a subclass to extend each step;
- the Python entry points: `TrainerCLI` (for a user's own ``main.py``) and
  `run_cli` (returns the exit status, like ``trainer.cli.main.main``);
- `ReduceLROnPlateau` with the metric it watches, for the ``lr_scheduler`` key.

It does not own the keys of a run and their parsing (``trainer/cli/_config_parser.py``), the
wording of parse errors (``trainer/cli/_config_errors.py``), seeding and the optimizer
replacement (``trainer/cli/_run_steps.py``), the saved config (`SaveConfigCallback`,
``trainer/cli/save_config.py``), the ``trainer <stage>`` subcommands' glue
(``trainer/cli/stage_commands.py``), the ``trainer`` command's own parser
(``trainer/cli/main.py``), the Trainer, or the checkpoint format.

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

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from trainer.callbacks.callback import Callback
from trainer.cli._checkpoint_hparams import checkpoint_hyperparameters
from trainer.cli._config_parser import (
    STAGE_HELP,
    STAGES,
    ConfigArgumentError,
    build_config_parser,
    dump_config,
    instantiate_classes,
    parse_config,
    parse_config_object,
)
from trainer.cli._run_steps import (
    import_class,
    replace_configure_optimizers,
    seed_run,
    under_stage,
    yaml_mapping,
)
from trainer.cli.save_config import CLI_CONFIG_KEY, SaveConfigCallback
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
    "run_cli",
]


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


class TrainerCLI:
    """Parse a run's config and options, build model, data and Trainer, and run the stage.

    LightningCLI's shape: ``TrainerCLI(MyModel, MyData)`` in a ``main.py`` gives
    ``python main.py fit --config run.yaml --model.lr 0.01``. Without classes, ``model`` and
    ``data`` take any subclass by ``class_path`` (what ``trainer fit`` does). A subclass extends
    it with LightningCLI's methods: `add_arguments_to_parser` (own options, ``link_arguments``),
    `before_instantiate_classes`, `after_instantiate_classes`, ``before_<stage>`` /
    ``after_<stage>`` (``before_fit``, ``after_test``, ...), `instantiate_trainer` and
    `configure_optimizers`.

    Args:
        model_class: the TrainModule class; its ``__init__`` arguments become ``model.<arg>``.
            None: ``model`` takes ``class_path`` + ``init_args`` of any TrainModule subclass.
        datamodule_class: the same for ``data`` and DataModule.
        args: the arguments (the subcommand first when ``run``); None reads ``sys.argv[1:]``.
            A mapping (or jsonargparse Namespace) is a config given whole, as LightningCLI takes
            it: ``{"fit": {"trainer": {...}, "model": {...}}}`` when ``run``, else
            ``{"trainer": {...}, ...}``.
        run: run the subcommand (``fit``, ``validate``, ``test``, ``predict``); with False
            there is no subcommand and no ``ckpt_path``: the objects are built, and the caller
            runs them (``cli.trainer.fit(cli.model, datamodule=cli.datamodule)``).
        trainer_defaults: Trainer arguments that replace the Trainer's defaults; its
            ``callbacks`` are always added, after the config's (LightningCLI's rule).
        seed_everything_default: ``seed_everything`` when the config does not set it; True
            draws a seed, written into the saved config so the run can be repeated.
        subclass_mode_model: with ``model_class``, accept its subclasses by ``class_path``.
        subclass_mode_data: the same for ``datamodule_class``.
        save_config: record the resolved config (``save_config_callback``); False does not.
        save_config_callback: the callback class that records it (`SaveConfigCallback` or a
            subclass); None records nothing.
        save_config_kwargs: its keyword arguments: ``config_filename``, ``overwrite``.
        parser_kwargs: jsonargparse ``ArgumentParser`` arguments (``default_config_files``,
            ``default_env``, ``env_prefix``, ...), for every stage, or per stage under the
            stage's name: ``{"fit": {"default_config_files": ["fit.yaml"]}}``.
        auto_configure_optimizers: offer the ``optimizer`` / ``lr_scheduler`` keys, which
            replace the model's ``configure_optimizers``; False leaves them out.
        exit_on_error: print ``error: <message>`` and exit (status 2 for a parse error, 1 for
            another TrainerError) instead of raising, as a command should.
        prog: the program name in help and errors (default: the script's name).
        trainer_class: the Trainer (sub)class built from ``trainer``; its own ``__init__``
            arguments are ``trainer.<arg>`` keys too.
        parser_class: a ``jsonargparse.ArgumentParser`` subclass to build the parser with
            (None: ``jsonargparse.ArgumentParser``).
        load_from_checkpoint_support: accepted for LightningCLI's signature; either value
            behaves as LightningCLI's False. LightningCLI's True saves the parsed config with an
            instantiator in the hyperparameters, so ``load_from_checkpoint`` rebuilds nested
            classes; here a checkpoint never names a class to build (docs/security.md), and
            the hyperparameters are what ``__init__`` received.

    Attributes:
        subcommand: the stage that ran: "fit", "validate", "test" or "predict".
        parser: the jsonargparse parser (of the stage, when ``run``).
        config: the parsed jsonargparse Namespace; as in LightningCLI, with ``run`` the stage's
            keys are under its name (``cli.config["fit"].trainer.max_epochs``) beside
            ``subcommand``.
        config_init: the same with the classes built.
        config_text: the resolved config (the stage's keys) as YAML.
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
        args: Sequence[str] | Mapping[str, Any] | None = None,
        run: bool = True,
        trainer_defaults: Mapping[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        save_config: bool = True,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: Mapping[str, Any] | None = None,
        parser_kwargs: Mapping[str, Any] | None = None,
        auto_configure_optimizers: bool = True,
        exit_on_error: bool = True,
        prog: str | None = None,
        trainer_class: type[Trainer] = Trainer,
        parser_class: type | None = None,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.subclass_mode_model = subclass_mode_model
        self.subclass_mode_data = subclass_mode_data
        self.save_config_callback = save_config_callback if save_config else None
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.parser_kwargs = dict(parser_kwargs or {})
        self.auto_configure_optimizers = auto_configure_optimizers
        self.trainer_class = _checked_class(trainer_class, Trainer, "trainer_class")
        self.parser_class = parser_class
        self.load_from_checkpoint_support = load_from_checkpoint_support
        self.prog = prog or Path(sys.argv[0]).name or "trainer"
        self.subcommand: str | None = None
        self.parser: Any = None
        self.config: Any = None
        self.config_init: Any = None
        self.config_text = ""
        self.model: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.trainer: Trainer | None = None
        self.result: Any = None
        arguments = sys.argv[1:] if args is None else args
        try:
            self._main(arguments, run)
        except TrainerError as err:
            if not exit_on_error:
                raise
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2 if isinstance(err, ConfigArgumentError) else 1) from None

    # ---- what a subclass overrides (LightningCLI's names) ------------------------------------
    def add_arguments_to_parser(self, parser: Any) -> None:
        """Add options or links to the stage's jsonargparse parser before it parses.

        E.g. ``parser.link_arguments("data.num_classes", "model.num_classes",
        apply_on="instantiate")`` or ``parser.add_argument("--notes", type=str)``.
        """

    def before_instantiate_classes(self) -> None:
        """Runs after parsing and seeding, before anything is built (``self.config`` is set)."""

    def after_instantiate_classes(self) -> None:
        """Runs once model, data and Trainer are built, before the stage."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer of the config's ``trainer`` keys, ``kwargs`` replacing them."""
        section = vars(self._stage(self.config_init).trainer)
        options = {key: value for key, value in section.items() if not key.startswith("__")}
        options.update(kwargs)
        options["callbacks"] = [
            *_as_list(options.get("callbacks")),
            *_as_list(self.trainer_defaults.get("callbacks")),
        ]
        if self.save_config_callback is not None:
            try:
                callback = self.save_config_callback(
                    yaml_mapping(self.config_text), self.config_text, **self.save_config_kwargs
                )
            except TypeError as err:
                raise ConfigurationError(
                    f"save_config_kwargs={self.save_config_kwargs!r} do not fit "
                    f"{self.save_config_callback.__name__} ({err}); SaveConfigCallback takes "
                    "config_filename and overwrite."
                ) from err
            options["callbacks"].append(callback)
        return self.trainer_class(**options)

    @staticmethod
    def configure_optimizers(
        module: TrainModule, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None
    ) -> Any:
        """What the module's ``configure_optimizers`` returns when the config gives
        ``optimizer`` (and ``lr_scheduler``, stepped every epoch)."""
        if lr_scheduler is None:
            return optimizer
        entry: dict[str, Any] = {"scheduler": lr_scheduler, "interval": "epoch"}
        if getattr(lr_scheduler, "monitor", None):
            entry["monitor"] = lr_scheduler.monitor
        return {"optimizer": optimizer, "lr_scheduler": entry}

    # ---- the run ------------------------------------------------------------------------------
    def _model_class_of(self, config: Any) -> type | None:
        """The class the config builds the model from: ``model_class``, or its ``class_path``."""
        if self.model_class is not None and not self.subclass_mode_model:
            return self.model_class
        class_path = getattr(config.get("model"), "class_path", None)
        return None if class_path is None else import_class(class_path, "model")

    def _main(self, arguments: Sequence[str] | Mapping[str, Any], run: bool) -> None:
        """Parse, seed, build, and (with ``run``) run: the whole life of a config-driven run."""
        if hasattr(arguments, "as_dict"):  # a jsonargparse Namespace
            arguments = arguments.as_dict()
        given = None if isinstance(arguments, Sequence) else arguments
        if run:
            given, arguments = self._take_subcommand(given, arguments)
        self.parser = build_config_parser(
            self.subcommand,
            model_class=self.model_class,
            datamodule_class=self.datamodule_class,
            subclass_mode_model=self.subclass_mode_model,
            subclass_mode_data=self.subclass_mode_data,
            # Callbacks given here are not defaults a config replaces: they are always added.
            trainer_defaults={k: v for k, v in self.trainer_defaults.items() if k != "callbacks"},
            seed_everything_default=self.seed_everything_default,
            auto_configure_optimizers=self.auto_configure_optimizers,
            prog=f"{self.prog} {self.subcommand}" if self.subcommand else self.prog,
            parser_kwargs=self._parser_kwargs(),
            trainer_class=self.trainer_class,
            parser_class=self.parser_class,
        )
        self.add_arguments_to_parser(self.parser)
        config = (
            parse_config(self.parser, list(arguments))
            if given is None
            else parse_config_object(self.parser, given)
        )
        if self.subcommand is not None:  # LightningCLI builds the model the checkpoint saved
            saved = checkpoint_hyperparameters(config.ckpt_path, self._model_class_of(config))
            if saved:
                source = f"the hyperparameters saved in ckpt_path {config.ckpt_path!r}: "
                config = parse_config_object(self.parser, {"model": saved}, config, source=source)
        self.config = config if self.subcommand is None else under_stage(self.subcommand, config)
        # Seed before anything is built, so the initial weights follow the seed too.
        config.seed_everything = seed_run(config.seed_everything)
        self.before_instantiate_classes()
        self.config_text = dump_config(self.parser, config)
        built = instantiate_classes(self.parser, config)
        self.config_init = built if self.subcommand is None else under_stage(self.subcommand, built)
        self.model = built.model
        if self.model is None:
            raise ConfigurationError(
                "no model: set 'model' in the config (model: {class_path: my_project.Net, "
                "init_args: {...}}) or pass --model my_project.Net."
            )
        self.datamodule = built.data
        optimizer, scheduler = config.get("optimizer"), config.get("lr_scheduler")
        if optimizer is not None or scheduler is not None:
            replace_configure_optimizers(
                self.model, optimizer, scheduler, self.configure_optimizers
            )
        self.trainer = self.instantiate_trainer()
        self.after_instantiate_classes()
        if run:
            self._run_subcommand(self.trainer)

    def _stage(self, config: Any) -> Any:
        return config if self.subcommand is None else config[self.subcommand]

    def _parser_kwargs(self) -> dict[str, Any]:
        """``parser_kwargs`` for this stage: the shared ones, then the stage's own."""
        shared = {k: v for k, v in self.parser_kwargs.items() if k not in STAGES}
        return {**shared, **dict(self.parser_kwargs.get(self.subcommand or "", {}))}

    def _take_subcommand(
        self, given: Mapping[str, Any] | None, arguments: Sequence[str] | Mapping[str, Any]
    ) -> tuple[Mapping[str, Any] | None, Sequence[str]]:
        """Split off the stage: the first token, or a config mapping's ``subcommand`` / stage key."""
        choices = ", ".join(STAGES)
        if given is not None:
            stages = [key for key in given if key in STAGES]
            stage = given.get("subcommand") or (stages[0] if len(stages) == 1 else None)
            if stage not in STAGES:
                raise ConfigArgumentError(
                    f"{self.prog}: a config given as args needs its stage, one of {choices}, as "
                    f"its one top-level key (e.g. {{'fit': {{'trainer': ...}}}}); received keys "
                    f"{sorted(given)}."
                )
            self.subcommand = stage
            return dict(given.get(stage) or {}), []
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
        return None, list(arguments[1:])

    def _run_subcommand(self, trainer: Trainer) -> None:
        """``before_<stage>``, ``trainer.<stage>(model, datamodule=..., ckpt_path=...)`` (eval
        metrics printed; what it returns in ``self.result``), ``after_<stage>``."""
        stage = str(self.subcommand)
        before = getattr(self, f"before_{stage}", None)
        if callable(before):
            before()
        options = {"verbose": False} if stage in ("validate", "test") else {}
        result = getattr(trainer, stage)(
            self.model,
            datamodule=self.datamodule,
            ckpt_path=self.config[stage].ckpt_path,
            **options,
        )
        if stage in ("validate", "test") and trainer.is_global_zero:
            for metrics in result:  # one dict per dataloader
                for name, value in sorted(metrics.items()):
                    print(f"{name}: {value:.6g}")
        self.result = result
        after = getattr(self, f"after_{stage}", None)
        if callable(after):
            after()


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


def _as_list(callbacks: Any) -> list[Any]:
    """A Trainer's ``callbacks`` argument (None, one callback, or several) as a list."""
    if callbacks is None:
        return []
    return [callbacks] if isinstance(callbacks, Callback) else list(callbacks)


def _checked_class(value: Any, base: type, argument: str) -> Any:
    """``value`` when it is ``base`` or a subclass of it.

    Raises:
        ConfigurationError: it is not.
    """
    if not (isinstance(value, type) and issubclass(value, base)):
        raise ConfigurationError(
            f"TrainerCLI({argument}={describe(value)}): expected {base.__name__} or a subclass "
            "of it."
        )
    return value
