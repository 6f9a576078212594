"""The steps of a config-driven run around `TrainerCLI`: seeding, the config's optimizer.

- `seed_run`: ``seed_everything`` of the config (a drawn seed shared with the processes a
  relaunch starts);
- `replace_configure_optimizers`: the ``optimizer`` / ``lr_scheduler`` keys in place of the
  module's ``configure_optimizers``;
- `under_stage` and `yaml_mapping`: the shapes LightningCLI gives its config.
"""

from __future__ import annotations

import importlib
import inspect
import os
import random
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe
from trainer.trainer.module import TrainModule

__all__ = [
    "import_class",
    "init_args",
    "replace_configure_optimizers",
    "seed_run",
    "under_stage",
    "yaml_mapping",
]

_MAX_SEED = 2**32 - 1
_SEED_ENV = "TRAINER_CLI_SEED"  # a drawn seed, for the processes a relaunch starts


def under_stage(stage: str, config: Any) -> Any:
    """``config`` under the key ``stage``, beside ``subcommand`` (LightningCLI's ``cli.config``)."""
    from jsonargparse import Namespace

    return Namespace(**{"subcommand": stage, stage: config})


def yaml_mapping(text: str) -> dict[str, Any]:
    """The YAML ``text`` of a dumped config as a mapping of plain values."""
    import yaml  # a dependency of trainer; imported here to keep `import trainer` light

    return dict(yaml.safe_load(text) or {})


def seed_run(value: bool | int) -> bool | int:
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


def replace_configure_optimizers(
    module: TrainModule,
    optimizer: Any,
    scheduler: Any,
    configure: Callable[[TrainModule, torch.optim.Optimizer, Any], Any],
) -> None:
    """Make ``module.configure_optimizers`` build the config's optimizer and scheduler and
    return ``configure(module, optimizer, scheduler)`` (``TrainerCLI.configure_optimizers``).

    They are built when the Trainer asks for them, so after ``configure_model``.
    """
    if optimizer is None:
        raise ConfigurationError(
            f"lr_scheduler ({scheduler.class_path}) is set but optimizer is not: add "
            "optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.001}} to the config."
        )
    optimizer_class = import_class(optimizer.class_path, "optimizer")
    scheduler_class = (
        None if scheduler is None else import_class(scheduler.class_path, "lr_scheduler")
    )
    if (
        scheduler_class is not None
        and issubclass(scheduler_class, torch.optim.lr_scheduler.ReduceLROnPlateau)
        and "monitor" not in inspect.signature(scheduler_class).parameters
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
        built = optimizer_class(self.parameters(), **init_args(optimizer))
        stepper = (
            None if scheduler_class is None else scheduler_class(built, **init_args(scheduler))
        )
        return configure(self, built, stepper)

    # An instance attribute: the class (and other instances of it) keep their own method.
    module.configure_optimizers = types.MethodType(configure_optimizers, module)  # type: ignore[method-assign]  # the CLI's replacement, by design


def init_args(section: Any) -> dict[str, Any]:
    init_args = getattr(section, "init_args", None)
    return {} if init_args is None else dict(init_args.as_dict())


def import_class(class_path: str, key: str) -> type:
    """The class at ``class_path`` (already checked by the parser when it parsed)."""
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigurationError(
            f"{key}.class_path {class_path!r} could not be imported ({describe(err)})."
        ) from err
