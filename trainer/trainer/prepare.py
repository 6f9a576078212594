"""Turning what a user passed into what the loops run, for one Trainer call.

- `build_accelerator`: the Accelerator (strategy, precision, accumulation) from the Trainer's arguments.
- `prepare_steps`: the module behind a `StepRouter`, prepared by the engine, and the step functions.
- `configure_optimizers`: ``configure_optimizers()``' result, checked and prepared.
- `find_loader` / `prepare_loader`: where a stage's dataloader comes from; one DataLoader
  prepared, with its batch count (`trainer.trainer.loaders` handles a stage's list of them).

The Trainer (``trainer.trainer.trainer``) decides when each runs; nothing here calls a hook.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.utils.data import DataLoader

from trainer.accelerator.accelerator import Accelerator
from trainer.accelerator.launchers import relaunch_with_torchrun
from trainer.data.index_recording import record_indices
from trainer.errors import ConfigurationError, HookResultError, describe
from trainer.precision import resolve_precision
from trainer.runtime.configs import DataLoaderConfiguration
from trainer.strategies import Strategy, detect_environment, resolve_strategy
from trainer.trainer import profiling
from trainer.trainer.data_hooks import batch_transfer
from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.optimizer_config import SchedulerConfig, parse_optimizer_config
from trainer.trainer.options import (
    device_count,
    resolve_device,
    resolve_limit,
    safe_len,
    warn_on_empty_loader,
)

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = [
    "PreparedSteps",
    "StepRouter",
    "build_accelerator",
    "configure_optimizers",
    "find_loader",
    "prepare_loader",
    "prepare_steps",
]


def build_accelerator(
    strategy: Any, accelerator: str, devices: Any, precision: Any, accumulate_grad_batches: int
) -> Accelerator:
    """The Accelerator for the Trainer's ``strategy`` / ``accelerator`` / ``devices`` / ``precision``.

    Asking for several devices outside a launcher re-runs the script under torchrun (and exits).
    """
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if precision == "32-true" and launched != "no":  # `trainer launch --mixed_precision`
        precision = launched  # replaces only the default; an explicit choice stays
    plugin = resolve_precision(precision)
    if isinstance(strategy, Strategy):
        chosen = strategy
    elif strategy == "single" or (
        strategy in ("auto", None) and not detect_environment().is_distributed
    ):
        chosen = resolve_strategy("single", device=resolve_device(accelerator, devices))
    else:  # multi-process engines take the device type; the launcher gives the rank
        count = device_count(devices)
        if count > 1 and not detect_environment().is_distributed:
            relaunch_with_torchrun(count)  # re-runs this script under torchrun, then exits
        chosen = resolve_strategy(
            strategy, accelerator=None if accelerator == "auto" else accelerator
        )
    return Accelerator(
        mixed_precision=plugin,
        strategy=chosen,
        gradient_accumulation_steps=accumulate_grad_batches,
        step_scheduler_with_optimizer=False,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )


class StepRouter(torch.nn.Module):
    """Routes ``forward(step_name, ...)`` to the module's step, so engine wrappers (DDP) see it."""

    routes_steps_to_module = True  # lower layers (FP8Precision) then name layers as the user does

    def __init__(self, module: TrainModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, step_name: str, *args: Any) -> Any:
        return getattr(self.module, step_name)(*args)


class PreparedSteps(NamedTuple):
    """What `prepare_steps` made: the router, the engine's model, and how to run each step."""

    router: StepRouter
    model: torch.nn.Module  # the engine-wrapped router (DDP, FSDP ...), or the router itself
    run_step: Callable[..., Any]  # run_step("validation_step", batch, batch_idx)
    training_step: Callable[..., Any] | None


def prepare_steps(
    trainer: Trainer, module: TrainModule, router: StepRouter | None
) -> PreparedSteps:
    """``module`` prepared by the engine behind a `StepRouter`, and the functions that run its steps.

    Pass the router of the previous call: one router per module, since in-place engines (FSDP2)
    must not shard the same tree twice.
    """
    if router is None or router.module is not module:
        router = StepRouter(module)
    if trainer.sync_batchnorm:  # in place: BatchNorm children become SyncBatchNorm
        torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
    prepared = trainer.accelerator.prepare(router)
    run_step: Callable[..., Any]
    if type(prepared) is StepRouter:  # untouched by the engine: call the steps directly
        run_step = lambda name, *args: getattr(module, name)(*args)  # noqa: E731
        training_step = getattr(module, "training_step", None)
    else:
        run_step = prepared
        training_step = partial(prepared, "training_step")
    if profiling.is_profiling(trainer.profiler):
        run_step = profiling.profiled_steps(trainer.profiler, run_step)
        if training_step is not None:
            training_step = profiling.profiled(trainer.profiler, "training_step", training_step)
    return PreparedSteps(router, prepared, run_step, training_step)


def configure_optimizers(
    trainer: Trainer, module: TrainModule
) -> tuple[list[Any], list[SchedulerConfig]]:
    """The prepared optimizers and scheduler configs of ``module.configure_optimizers()``, checked."""
    returned = module.configure_optimizers()
    where = f"{type(module).__name__}.configure_optimizers"
    if returned is None and module.automatic_optimization:
        raise HookResultError(
            f"configure_optimizers returned None under automatic optimization ({where}). "
            "Return an optimizer, e.g. torch.optim.AdamW(self.parameters(), lr=1e-3), or "
            "set automatic_optimization = False and step optimizers yourself."
        )
    optimizers, schedulers = (
        ([], []) if returned is None else parse_optimizer_config(returned, where)
    )
    if not module.automatic_optimization and (
        trainer.accumulate_grad_batches > 1 or bool(trainer.gradient_clip_val)
    ):
        raise ConfigurationError(
            f"{type(module).__name__} uses manual optimization (automatic_optimization = False), "
            "so Trainer(accumulate_grad_batches=...) and Trainer(gradient_clip_val=...) cannot "
            "apply: step every N batches and call self.clip_gradients / "
            "torch.nn.utils.clip_grad_norm_ yourself in training_step."
        )
    if module.automatic_optimization and len(optimizers) > 1:
        raise HookResultError(
            f"configure_optimizers returned {len(optimizers)} optimizers under automatic "
            f"optimization ({where}). Return one, or set automatic_optimization = False and "
            "step them in training_step with self.optimizers()."
        )
    prepared = trainer.accelerator.prepare(*optimizers) if optimizers else []
    prepared_list = (
        list(prepared) if isinstance(prepared, tuple) else [prepared] if optimizers else []
    )
    return prepared_list, schedulers


def prepare_loader(
    trainer: Trainer,
    name: str,
    loader: Any,
    dataloader_idx: int = 0,
    *,
    with_transfer_hooks: bool = True,
) -> tuple[Any, float]:
    """``loader`` prepared for the ``name`` stage, and its batch count under ``limit_*_batches``.

    Its batches go through the batch-transfer hooks when the module or DataModule overrides one
    (`trainer.trainer.data_hooks`); the loader then leaves the move to them. With
    ``with_transfer_hooks=False`` (one of several train loaders read together, whose whole batch
    goes through the hooks) it leaves the move to the hooks but does not call them.

    Raises:
        ConfigurationError: ``loader`` is not a DataLoader, or its ``limit_*_batches`` fraction
            keeps less than one batch (`trainer.trainer.limits.resolve_limit`).
    """
    if not isinstance(loader, DataLoader):
        argument = {"train": "train_dataloaders", "validation": "val_dataloaders"}.get(
            name, "dataloaders"
        )
        raise ConfigurationError(
            f"trainer: {argument}={describe(loader)} is not a torch.utils.data.DataLoader. "
            "Wrap your dataset: DataLoader(dataset, batch_size=32)."
        )
    accelerator = trainer.accelerator
    transfer = batch_transfer(
        trainer.module, trainer.datamodule, accelerator.device, dataloader_idx
    )
    # use_distributed_sampler=False: the user's sampler already shards (Lightning's meaning).
    # Predict pads no batch (Lightning's unrepeated sampler): each sample predicted once,
    # unless a forward waits for every process (sharded parameters): then all run as many.
    is_unpadded = name == "predict" and not trainer.strategy.forward_needs_all_processes
    prepared = accelerator.prepare_data_loader(
        loader,
        device_placement=False if transfer is not None else None,
        shard=trainer.use_distributed_sampler,
        even_batches=False if is_unpadded else None,
    )
    if name == "predict":  # a BasePredictionWriter gets each batch's dataset indices
        prepared.index_recorder = record_indices(prepared)
    if transfer is not None and with_transfer_hooks:  # after the precision's cast, as Lightning
        cast = prepared.transform
        prepared.transform = transfer if cast is None else lambda batch: transfer(cast(batch))
    length = safe_len(prepared)
    warn_on_empty_loader(name, length)
    argument, value, described = _limit_names(trainer, name, dataloader_idx)
    limit = resolve_limit(argument, value, length, described)
    prepared.limit = None if math.isinf(limit) else int(limit)
    count = limit if math.isinf(limit) else int(limit)
    return prepared, count


def _limit_names(trainer: Trainer, name: str, dataloader_idx: int) -> tuple[str, Any, str]:
    """The argument that limits the ``name`` loader, its value, and the loader, for messages."""
    prefix = "val" if name == "validation" else name
    is_overfit = trainer.overfit_batches and name in ("train", "validation")
    argument = "overfit_batches" if is_overfit else f"limit_{prefix}_batches"
    loader = f"{prefix}_dataloader" + (
        f" (dataloader_idx {dataloader_idx})" if dataloader_idx else ""
    )
    return argument, trainer.limit_batches[name], loader


def find_loader(name: str, datamodule: DataModule | None, module: TrainModule | None) -> Any:
    """``{name}_dataloader()`` of the datamodule, else of the module, else None."""
    method = f"{'val' if name == 'validation' else name}_dataloader"
    for source in (datamodule, module):
        function = getattr(source, method, None)
        if function is not None:
            return function()
    return None
