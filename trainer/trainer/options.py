"""Checks and resolves the Trainer's constructor arguments (kept out of ``Trainer.__init__``).

Each function takes raw user values and returns resolved ones, or raises ConfigurationError naming
the argument, the value received and the fix.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError, describe
from trainer.loggers.logger import Logger
from trainer.trainer.durations import parse_duration
from trainer.trainer.limits import (  # the counting arguments, re-exported for the Trainer
    check_accumulation,
    check_min_limits,
    check_overfit_batches,
    check_sanity_steps,
    check_val_interval,
    resolve_limit,
)

if TYPE_CHECKING:
    from trainer.precision import Precision
    from trainer.strategies.environment import ClusterEnvironment
    from trainer.trainer.module import TrainModule

__all__ = [
    "apply_benchmark",
    "check_accumulation",
    "check_bool",
    "check_max_steps",
    "check_min_limits",
    "check_overfit_batches",
    "check_positive_int",
    "check_sanity_steps",
    "check_sync_batchnorm",
    "check_val_interval",
    "datamodule_argument",
    "parse_max_time",
    "resolve_device",
    "resolve_limit",
    "resolve_plugins",
    "resolve_root_dir",
    "warn_on_empty_epoch",
    "warn_on_empty_loader",
]


def _fail(argument: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"Trainer({argument}={describe(value)}): expected {expected}.")


def check_positive_int(argument: str, value: Any, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(argument, value, f"an int >= {low}")
    return value


def parse_max_time(value: str | dt.timedelta | dict[str, int] | None) -> dt.timedelta | None:
    """``"DD:HH:MM:SS"``, a timedelta or a dict of timedelta fields -> timedelta."""
    return None if value is None else parse_duration("Trainer(max_time", value)


def resolve_device(accelerator: str, devices: Any) -> torch.device:
    """The one device a single-process run uses, from ``accelerator`` and ``devices``."""
    kinds = ("auto", "cpu", "cuda", "gpu", "mps")
    if accelerator not in kinds:
        raise _fail("accelerator", accelerator, f"one of {kinds}")
    if accelerator == "auto":
        if torch.cuda.is_available():
            accelerator = "cuda"
        elif torch.backends.mps.is_available():
            accelerator = "mps"
        else:
            accelerator = "cpu"
    accelerator = "cuda" if accelerator == "gpu" else accelerator
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError(
            "Trainer(accelerator='cuda'): no CUDA device is available on this machine. "
            "Use accelerator='cpu' or 'auto'."
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigurationError("Trainer(accelerator='mps'): MPS is not available. Use 'cpu'.")
    index = 0
    if isinstance(devices, list | tuple) and len(devices) == 1:
        index = int(devices[0])
    elif devices in ("auto", 1, "1", -1, None) or (
        isinstance(devices, list | tuple) and not devices
    ):
        index = 0
    else:
        raise ConfigurationError(
            f"Trainer(devices={describe(devices)}): one process uses one device. For several "
            "devices choose a multi-process strategy (strategy='ddp' or 'fsdp') and start it "
            "with `trainer launch`."
        )
    if accelerator == "cpu":
        return torch.device("cpu")
    return torch.device(accelerator, index) if accelerator == "cuda" else torch.device(accelerator)


def is_instance_named(obj: object, name: str) -> bool:
    """Whether a class named ``name`` is in ``obj``'s MRO (without importing that class)."""
    return any(klass.__name__ == name for klass in type(obj).__mro__)


# Lightning's Checkpoint callbacks, by class name (ModelCheckpoint, OnExceptionCheckpoint).
_CHECKPOINT_CLASSES = frozenset({"Checkpoint", "ModelCheckpoint", "OnExceptionCheckpoint"})
# Progress bars, by class name (the ProgressBar base, the rich and the tqdm bars).
_PROGRESS_BAR_CLASSES = frozenset({"ProgressBar", "RichProgressBar", "TQDMProgressBar"})


def is_checkpoint_callback(callback: object) -> bool:
    """Whether ``callback`` writes checkpoints (Lightning's ``Checkpoint`` callbacks)."""
    return any(klass.__name__ in _CHECKPOINT_CLASSES for klass in type(callback).__mro__)


def is_progress_bar(callback: object) -> bool:
    """Whether ``callback`` is a progress bar (Lightning's ``ProgressBar`` callbacks)."""
    return any(klass.__name__ in _PROGRESS_BAR_CLASSES for klass in type(callback).__mro__)


def check_fast_dev_run(value: bool | int) -> int:
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"Trainer(fast_dev_run={describe(value)}): expected True/False or an int >= 0 of batches."
        )
    return value


def check_max_steps(value: int | None) -> int:
    """``max_steps``: an int >= 0, or -1 (None) for no step limit, as in Lightning."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigurationError(
            f"Trainer(max_steps={describe(value)}): expected an int >= 0, or -1 for no step "
            "limit. Pass e.g. max_steps=1000, or leave it at -1 and bound the run with max_epochs."
        )
    return value


def check_bool(argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(argument, value, "True or False")
    return value


def default_max_epochs(max_epochs: int | None, max_steps: int | None) -> int | None:
    """``max_epochs`` checked; None becomes 1000 with no step limit (Lightning), else -1."""
    if max_epochs is not None and (
        isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < -1
    ):
        raise ConfigurationError(
            f"Trainer(max_epochs={describe(max_epochs)}): expected an int >= 0, -1 for no epoch "
            "limit, or None (1000 epochs unless max_steps is set). Pass e.g. max_epochs=10."
        )
    if max_epochs is None and max_steps in (None, -1):
        return 1000  # Lightning's default when nothing bounds the run
    return max_epochs if max_epochs is not None else -1


def resolve_root_dir(value: str | os.PathLike[str] | None) -> str:
    """``default_root_dir`` as a str path; None (or "") is the current directory."""
    if value is None or value == "":
        return os.getcwd()
    if not isinstance(value, str | os.PathLike) or isinstance(os.fspath(value), bytes):
        raise ConfigurationError(
            f"Trainer(default_root_dir={describe(value)}): expected a str or os.PathLike folder "
            "path, or None for the current directory. Pass e.g. default_root_dir='runs/exp1'."
        )
    return os.fspath(value)


def check_clip(value: float | None, algorithm: str | None) -> str:
    """``gradient_clip_algorithm`` (None: "norm", as in Lightning), with its value checked."""
    if algorithm is None:
        return check_clip(value, "norm")
    if algorithm not in ("norm", "value"):
        raise ConfigurationError(
            f"Trainer(gradient_clip_algorithm={algorithm!r}): expected 'norm' or 'value'."
        )
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or value < 0
    ):
        raise ConfigurationError(
            f"Trainer(gradient_clip_val={describe(value)}): expected a number >= 0 or None "
            "(0 and None clip nothing, as in Lightning)."
        )
    return algorithm


def build_loggers(logger: Any, root: str, *, fast_dev_run: bool = False) -> list[Logger]:
    """The Trainer's loggers; under ``fast_dev_run`` one DummyLogger in their place (none
    without a logger), as Lightning: the smoke test's logging calls run and write nothing."""
    if fast_dev_run:
        loggers = [] if logger in (False, None) else build_loggers(logger, root)
        if not loggers:
            return []
        from trainer.loggers.dummy import DummyLogger

        return [DummyLogger()]
    if logger is True:
        from trainer.loggers.csv_logs import CSVLogger

        return [CSVLogger(save_dir=root, name="trainer_logs")]
    if logger in (False, None):
        return []
    if isinstance(logger, Logger):
        loggers = [logger]
    elif isinstance(logger, list | tuple):
        loggers = list(logger)
    else:
        raise ConfigurationError(
            f"Trainer(logger={describe(logger)}): expected True, False, a trainer.loggers.Logger or "
            "a list of them, e.g. logger=TensorBoardLogger('logs') (names like 'csv' are for "
            "Accelerator(log_with=...))."
        )
    for item in loggers:
        if not isinstance(item, Logger):
            raise ConfigurationError(
                f"Trainer(logger=...): {describe(item)} is not a trainer.loggers.Logger. Pass "
                "True, False, a Logger, or a list of Loggers."
            )
    return loggers


def overrides(module: Any, method: str) -> bool:
    return callable(getattr(module, method, None))


def device_count(devices: Any) -> int:
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices if devices > 0 else max(1, torch.cuda.device_count())
    if isinstance(devices, list | tuple):
        return len(devices)
    return max(1, torch.cuda.device_count()) if devices == "auto" else int(devices)


def safe_len(loader: Any) -> float:
    try:
        return len(loader)
    except TypeError:
        return math.inf


def warn_on_empty_loader(name: str, length: float) -> None:
    """A loader of length 0 trains or evaluates nothing: say so (Lightning warns too)."""
    if length != 0:
        return
    limit = f"limit_{'val' if name == 'validation' else name}_batches=0"
    warn_user(
        f"trainer: the {name} dataloader has 0 batches (len(dataloader) == 0), so this run will "
        f"skip it. Check that its dataset is not empty and that batch_size with drop_last=True "
        f"leaves at least one batch; to skip it on purpose pass {limit}."
    )


def warn_on_empty_epoch(epoch: int) -> None:
    """An epoch without a batch would repeat forever when no epoch limit is set (Lightning hangs)."""
    warn_user(
        f"trainer: the train dataloader yielded no batches in epoch {epoch}, so fit stops here "
        "(a next epoch would yield none either). Check that the dataset's __iter__ yields "
        "samples, e.g. that each worker or process gets a share of the data."
    )


def module_argument(module: Any, model: Any, stage: str) -> Any:
    """The module of ``trainer.<stage>(...)``: ``module``, or Lightning's keyword ``model=``.

    Raises:
        ConfigurationError: both were given, and they differ.
    """
    if model is None:
        return module
    if module is not None and module is not model:
        raise ConfigurationError(
            f"trainer.{stage}() received two modules, module= (a {type(module).__name__}) and "
            f"model= (a {type(model).__name__}); pass one (model= is Lightning's name for module)."
        )
    return model


def datamodule_argument(loaders: Any, datamodule: Any, stage: str) -> tuple[Any, Any]:
    """``trainer.<stage>(module, dm)``: a DataModule given where the dataloaders go is the
    DataModule, as in Lightning -> ``(loaders, datamodule)``.

    Raises:
        ConfigurationError: a DataModule there and another one as ``datamodule=``.
    """
    from trainer.trainer.module import DataModule

    if not isinstance(loaders, DataModule):
        return loaders, datamodule
    if datamodule is not None and datamodule is not loaders:
        raise ConfigurationError(
            f"trainer.{stage}() received two DataModules, one in place of the dataloaders and "
            "one as datamodule=; pass one."
        )
    return None, loaders


def check_call_arguments(module: Any, datamodule: Any, stage: str) -> None:
    """The module and DataModule given to ``trainer.<stage>(...)``.

    Raises:
        ConfigurationError: ``module`` is not a TrainModule (for ``fit``, or lacks its required
            methods), or ``datamodule`` is neither None nor a DataModule.
    """
    from trainer.trainer.module import DataModule, TrainModule

    if not isinstance(module, TrainModule):
        raise ConfigurationError(
            f"trainer.{stage}(module={describe(module)}): expected a trainer.TrainModule "
            "subclass instance. Subclass TrainModule and implement training_step."
        )
    if stage == "fit":
        check_module_for_fit(module)
    if datamodule is not None and not isinstance(datamodule, DataModule):
        raise ConfigurationError(
            f"trainer.{stage}(datamodule={describe(datamodule)}): expected a trainer.DataModule."
        )


def check_module_for_fit(module: TrainModule) -> None:
    name = type(module).__name__
    if not overrides(module, "training_step"):
        raise ConfigurationError(
            f"{name} has no training_step. Implement training_step(self, batch, batch_idx) "
            "returning the loss."
        )
    if not overrides(module, "configure_optimizers"):
        raise ConfigurationError(
            f"{name} has no configure_optimizers. Implement it, e.g. "
            "`return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
        )


def resolve_plugins(plugins: Any) -> tuple[Precision | None, ClusterEnvironment | None]:
    """``Trainer(plugins=...)``: a precision plugin and/or a cluster environment (Lightning's).

    A `trainer.plugins.AsyncCheckpointIO` is accepted too (at most one); the Trainer takes it
    with `trainer.plugins.async_checkpoint.find_checkpoint_io`.

    Raises:
        ConfigurationError: for anything else, or two plugins of one kind.
    """
    from trainer.plugins import AsyncCheckpointIO
    from trainer.precision import Precision
    from trainer.strategies.environment import ClusterEnvironment

    kinds = (Precision, ClusterEnvironment, AsyncCheckpointIO)
    items = (
        [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    )
    found: dict[type, Any] = {}
    for item in items:
        kind = next((k for k in kinds if isinstance(item, k)), None)
        if kind is None:
            raise ConfigurationError(
                f"Trainer(plugins=[..., {describe(item)}, ...]): expected a trainer.precision "
                "Precision instance, a trainer.strategies.environment.ClusterEnvironment "
                "instance or a trainer.plugins.AsyncCheckpointIO. Pass precision names with "
                "Trainer(precision=...) instead."
            )
        if kind in found:
            raise ConfigurationError(
                f"Trainer(plugins=...): two {kind.__name__} plugins ({describe(found[kind])} and "
                f"{describe(item)}). Pass one."
            )
        found[kind] = item
    return found.get(Precision), found.get(ClusterEnvironment)


def apply_benchmark(benchmark: bool | None, deterministic: bool) -> None:
    """Set ``torch.backends.cudnn.benchmark`` as Lightning does (None: keep, False if deterministic)."""
    if benchmark is None and deterministic:
        benchmark = False
    if benchmark is not None:
        if not isinstance(benchmark, bool):
            raise ConfigurationError(
                f"Trainer(benchmark={describe(benchmark)}): expected True, False or None."
            )
        torch.backends.cudnn.benchmark = benchmark


def check_sync_batchnorm(sync_batchnorm: bool, accelerator: Any, devices: Any) -> bool:
    """Whether BatchNorm layers become SyncBatchNorm: several processes on an accelerator only.

    Checked before any process group is joined, from the launcher's environment and ``devices``.

    Raises:
        ConfigurationError: ``sync_batchnorm=True`` with several processes on CPU, where torch's
            SyncBatchNorm does not run.
    """
    if not isinstance(sync_batchnorm, bool):
        raise _fail("sync_batchnorm", sync_batchnorm, "True or False")
    from trainer.strategies import detect_environment

    processes = max(detect_environment().world_size, device_count(devices))
    if not sync_batchnorm or processes <= 1:
        return False
    is_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if is_cpu:
        raise ConfigurationError(
            f"Trainer(sync_batchnorm=True) with {processes} processes on CPU: torch's "
            "SyncBatchNorm runs on CUDA (and other accelerators) only. Pass sync_batchnorm=False "
            "on CPU, or train on GPUs."
        )
    return True
