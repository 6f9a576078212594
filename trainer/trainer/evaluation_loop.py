"""One epoch of validation, test or predict: the hooks, the steps under no_grad, the metrics.

Used by ``Trainer.validate`` / ``test`` / ``predict``, by the sanity check and by validation
inside fit (`trainer.trainer.fit_loop`). The order of the hooks is DESIGN §3's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError
from trainer.trainer.logger_rows import eval_epoch_step, send_to_loggers
from trainer.trainer.options import overrides

if TYPE_CHECKING:
    from trainer.trainer.metrics import MetricStore
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["STAGE_OF", "STEP_NAMES", "run_eval_epoch"]

STEP_NAMES = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}
STAGE_OF = {"validation": "validate", "test": "test", "predict": "predict"}


def run_eval_epoch(trainer: Trainer, run: Run, stage: str) -> Any:
    """One epoch of ``stage`` ("validation", "test", "predict"): hooks, steps, metrics.

    Returns the predictions (predict), else the logged epoch values by published name
    (Lightning's ``validate()`` / ``test()`` results).
    """
    module = trainer.module
    loader = run.loaders.get(stage)
    step_name = STEP_NAMES[stage]
    if loader is None or not overrides(module, step_name):
        if stage != "validation":
            raise ConfigurationError(
                f"trainer.{STAGE_OF[stage]}: {type(module).__name__} has no {step_name}. "
                f"Implement {step_name}(self, batch, batch_idx)."
            )
        return {}
    call = run.hooks.call
    store = run.stores.get(stage)
    if store is not None:
        store.start_epoch()
        store.hook = (step_name, False, True)
        module._metric_store = store
    is_logging = store is not None and not trainer.sanity_checking
    run.model.eval()
    predictions: list[Any] = []
    call(f"on_{stage}_start")
    call(f"on_{stage}_epoch_start")
    with torch.no_grad():
        for batch_idx, batch in enumerate(loader):
            if store is not None:
                store.current_batch = batch
            call(f"on_{stage}_batch_start", batch, batch_idx)
            with trainer.accelerator.autocast():
                output = run.run_step(step_name, batch, batch_idx)
            if stage == "predict":
                predictions.append(output)
            call(f"on_{stage}_batch_end", output, batch, batch_idx)
            if is_logging:
                _send_step_row(trainer, store)
    if store is None:
        call(f"on_{stage}_epoch_end")
    else:
        store.hook = (f"on_{stage}_epoch_end", False, True)  # errors of self.log name it
        try:
            call(f"on_{stage}_epoch_end")
        finally:
            store.hook = (step_name, False, True)
        store.finalize_epoch()
    if is_logging:
        send_to_loggers(trainer, store.epoch_items(for_logger=True), eval_epoch_step(trainer))
    call(f"on_{stage}_end")
    module._metric_store = run.stores["train"]
    if stage == "predict":
        return predictions
    return store.epoch_items(for_logger=True) if store is not None else {}


def _send_step_row(trainer: Trainer, store: MetricStore) -> None:
    """Lightning's validation/test step rows: ``on_step`` values (``name_step``) at the count
    of batches of this stage so far in the run, with no ``epoch``."""
    items = store.step_items(for_logger=True)
    if items:
        send_to_loggers(trainer, items, store.batch_count, has_epoch=False)
    store.batch_count += 1
