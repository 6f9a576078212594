"""One epoch of validation, test or predict: the hooks, the steps without gradients, the metrics.

Used by ``Trainer.validate`` / ``test`` / ``predict``, by the sanity check and by validation
inside fit (`trainer.trainer.fit_loop`). The order of the hooks is DESIGN §3's. As in Lightning:

- the whole epoch runs under ``torch.no_grad`` inside ``fit``, and under
  ``torch.inference_mode`` in ``validate`` / ``test`` / ``predict`` when
  ``Trainer(inference_mode=True)`` (the default; gloo process groups and XLA devices get
  ``no_grad``);
- several dataloaders run one after the other; then the steps and batch hooks receive
  ``dataloader_idx`` too, ``self.log`` names get ``/dataloader_idx_N``, and the epoch gives one
  result per dataloader.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError
from trainer.trainer.dataloader_idx import check_dataloader_idx
from trainer.trainer.hooks import LOG_KEYS
from trainer.trainer.log_refusal import RefusedLogging
from trainer.trainer.logger_rows import logging_step, send_to_loggers
from trainer.trainer.mode_hooks import restore_modes, switch_to_eval
from trainer.trainer.options import overrides, safe_len

if TYPE_CHECKING:
    from trainer.trainer.metrics import MetricStore
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["STAGE_OF", "STEP_NAMES", "run_eval_epoch"]

STEP_NAMES = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}
STAGE_OF = {"validation": "validate", "test": "test", "predict": "predict"}


def run_eval_epoch(trainer: Trainer, run: Run, stage: str) -> list[Any] | None:
    """One epoch of ``stage`` ("validation", "test", "predict"): hooks, steps, metrics.

    Returns one entry per dataloader: its predictions (predict), else the logged epoch values
    by published name (Lightning's ``validate()`` / ``test()`` results); with no batch at all,
    ``[]`` (None for predict), as Lightning.
    """
    module = trainer.module
    loaders = run.loaders.get(stage)
    step_name = STEP_NAMES[stage]
    if not loaders or not overrides(module, step_name):
        if stage != "validation":
            raise ConfigurationError(
                f"trainer.{STAGE_OF[stage]}: {type(module).__name__} has no {step_name}. "
                f"Implement {step_name}(self, batch, batch_idx)."
            )
        return [{}]
    if stage == "predict" and not _has_forward(module):
        raise ConfigurationError(
            f"trainer.predict: {type(module).__name__} has neither a predict_step nor a forward "
            "(the default predict_step calls forward on the batch). Implement one of them."
        )
    check_dataloader_idx(module, stage, is_multiple=len(loaders) > 1)
    if all(safe_len(loader) == 0 for loader in loaders):
        # Lightning skips a stage without a batch (limit 0): no hooks, no row; predict -> None
        return None if stage == "predict" else []
    running = "sanity_check" if trainer.sanity_checking else STAGE_OF[stage]
    with trainer.state.running_as(running), _grad_context(trainer):
        return _run_epoch(trainer, run, stage, loaders)


def _has_forward(module: Any) -> bool:
    """Whether ``predict_step`` can run: the module's own, or the default calling ``forward``."""
    from trainer.trainer.module import TrainModule

    def is_default(name: str, default: Any) -> bool:  # an instance attribute counts as its own
        return getattr(getattr(module, name), "__func__", None) is default

    return not is_default("predict_step", TrainModule.predict_step) or not is_default(
        "forward", torch.nn.Module.forward
    )


def _run_epoch(trainer: Trainer, run: Run, stage: str, loaders: list[Any]) -> list[Any]:
    module = trainer.module
    step_name = STEP_NAMES[stage]
    call = run.hooks.call
    store = run.stores.get(stage)
    if store is not None:
        store.start_epoch()
        store.hook = LOG_KEYS[step_name]
        module.metric_store = store
    elif stage == "predict":  # self.log raises in predict_step, as in Lightning
        module.metric_store = RefusedLogging(step_name, module.metric_store)
    is_logging = store is not None and not trainer.sanity_checking
    modes = switch_to_eval(module, stage)  # on_<stage>_model_eval
    predictions: list[list[Any]] = [[] for _ in loaders]
    call(f"on_{stage}_start")
    call(f"on_{stage}_epoch_start")
    is_multiple = len(loaders) > 1
    # With several loaders the batch hooks get dataloader_idx too (callbacks that take it).
    call_batch_hook = run.hooks.call_with_dataloader_idx if is_multiple else call
    for dataloader_idx, loader in enumerate(loaders):
        extra = (dataloader_idx,) if is_multiple else ()
        if store is not None and is_multiple:
            store.dataloader_idx = dataloader_idx
        recorder = getattr(loader, "index_recorder", None)  # predict's (`record_indices`)
        for batch_idx, batch in enumerate(loader):
            if stage == "predict":  # the batch's dataset indices, for BasePredictionWriter
                trainer.predict_batch_indices = None if recorder is None else recorder.take()
            if store is not None:
                store.current_batch = batch
                store.touch_steps()
            call_batch_hook(f"on_{stage}_batch_start", batch, batch_idx, *extra)
            with trainer.accelerator.autocast():
                output = run.run_step(step_name, batch, batch_idx, *extra)
            if stage == "predict" and run.keep_predictions:
                predictions[dataloader_idx].append(output)
            call_batch_hook(f"on_{stage}_batch_end", output, batch, batch_idx, *extra)
            if is_logging:
                _send_step_row(trainer, store)
    if store is None:
        call(f"on_{stage}_epoch_end")
    else:
        store.dataloader_idx = None  # what the epoch-end hooks log belongs to no dataloader
        store.finalize_epoch()  # the hook reads this epoch's values (callback_metrics), as Lightning
        store.touch_epochs()
        call(f"on_{stage}_epoch_end")
        store.finalize_epoch()  # and what the hook logged
    if is_logging:
        send_to_loggers(trainer, store.epoch_items(for_logger=True), logging_step(trainer))
    call(f"on_{stage}_end")
    restore_modes(module, stage, modes)  # each submodule's, or on_<stage>_model_train
    module.metric_store = run.stores["train"]
    if stage == "predict":
        return predictions
    if store is None:
        return [{} for _ in loaders]
    if not is_multiple:
        return [store.epoch_items(for_logger=True)]
    return [store.epoch_items(for_logger=True, dataloader_idx=i) for i in range(len(loaders))]


def _grad_context(trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
    """``no_grad`` inside fit; ``inference_mode`` in validate/test/predict when it is on and
    works here (not over a gloo process group, not on XLA: Lightning's exceptions)."""
    if trainer.state.stage == "fit" or not trainer.inference_mode:
        return torch.no_grad()
    is_gloo = (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_backend() == "gloo"
    )
    if is_gloo or trainer.strategy.root_device.type == "xla":
        return torch.no_grad()
    return torch.inference_mode()


def _send_step_row(trainer: Trainer, store: MetricStore) -> None:
    """Lightning's validation/test step rows: ``on_step`` values (``name_step``) at the count
    of batches of this dataloader so far in the run, with no ``epoch``."""
    idx = store.dataloader_idx or 0
    step = store.batch_counts.get(idx, 0)
    items = store.step_items(for_logger=True)
    if items:
        send_to_loggers(trainer, items, step, has_epoch=False)
    store.batch_counts[idx] = step + 1
