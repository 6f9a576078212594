"""Writing the Trainer's metric rows and hyperparameters to its loggers, at Lightning's steps.

The metric store (``trainer.trainer.metrics``) decides which values a row holds; this module
decides the step a row is written at and does the one host read of the values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigurationError
from trainer.trainer.metrics import to_float

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["is_log_due", "log_hyperparams", "logging_step", "send_to_loggers"]


def is_log_due(count: int, trainer: Trainer) -> bool:
    """Lightning's ``should_update_logs``: the ``count``-th step (or evaluation batch) is a
    multiple of ``log_every_n_steps``, or the run is stopping; never with
    ``log_every_n_steps=0``."""
    every = trainer.log_every_n_steps
    return every > 0 and (count % every == 0 or trainer.should_stop)


def send_to_loggers(
    trainer: Trainer, items: dict[str, Any], step: int | None = None, *, has_epoch: bool = True
) -> None:
    """Read the values (the one host sync) and write them to every logger on rank zero.

    ``step`` defaults to Lightning's training step: the batches that stepped before the current
    one, ``progress.batches_stepped - 1`` once it has stepped (every ``log_every_n_steps``:
    steps n-1, 2n-1, ...; epoch-end rows share the step of the epoch's last batch, -1 when no
    batch stepped yet, as in Lightning). Under automatic optimization that count is
    ``global_step``; under manual optimization every batch counts once, however many
    optimizers it stepped. Rows carry ``epoch`` unless ``has_epoch`` is False (Lightning's
    validation/test step rows). In the other rows a metric logged as ``"step"`` is, as in
    Lightning, the row's step instead (and the row gets no ``epoch``): e.g.
    ``self.log("step", float(self.current_epoch))`` in ``on_validation_epoch_end`` puts the
    epoch's values at step = epoch.
    """
    if not items or not trainer.loggers or not trainer.is_global_zero:
        return
    with trainer.profiler.profile("log_metrics"):  # a no-op context without a profiler
        _write_row(trainer, items, step, has_epoch)


def _write_row(trainer: Trainer, items: dict[str, Any], step: int | None, has_epoch: bool) -> None:
    metrics = {name: to_float(value) for name, value in items.items()}
    if has_epoch and "step" in metrics:  # Lightning: a logged "step" is the row's step
        step = int(metrics.pop("step"))
    else:
        if step is None:
            step = trainer.progress.batches_stepped - 1
        if has_epoch:
            metrics.setdefault("epoch", float(trainer.progress.epoch))
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def logging_step(trainer: Trainer) -> int:
    """Lightning's logger step between rows: within fit, the batches that stepped before the
    current one (the step of its training row: validation/test epoch rows, DeviceStatsMonitor);
    in the sanity check, before any batch, and outside fit, all of them."""
    step = trainer.progress.batches_stepped
    if (
        trainer.state.stage == "fit"
        and not trainer.sanity_checking
        and (trainer.accelerator.sync_gradients or not trainer.module.automatic_optimization)
    ):
        step -= 1  # this batch stepped (manual optimization: every batch counts)
    return step


def log_hyperparams(trainer: Trainer) -> None:
    """As Lightning, at the start of every stage (after ``on_fit_start`` in fit): the module's
    and the datamodule's hyperparameters as ``save_hyperparameters`` recorded them
    (``hparams_initial``; each left out when saved with ``logger=False``), then the model graph
    (``log_graph``: TensorBoardLogger(log_graph=True) traces ``example_input_array``), to every
    logger on rank zero. ``Trainer(enable_autolog_hparams=False)`` skips this.

    Raises:
        ConfigurationError: a key both hold with different values (Lightning refuses to merge).
    """
    module = trainer.module
    if module is None or not trainer.is_global_zero or not trainer.loggers:
        return
    datamodule = trainer.datamodule
    params = dict(module.hparams_initial) if getattr(module, "_log_hyperparams", True) else {}
    if datamodule is not None and getattr(datamodule, "_log_hyperparams", True):
        from_data = dict(datamodule.hparams_initial)
        clashing = sorted(k for k in params.keys() & from_data.keys() if params[k] != from_data[k])
        if clashing:
            raise ConfigurationError(
                f"hyperparameters {clashing} are saved by both {type(module).__name__} and "
                f"{type(datamodule).__name__} with different values; the loggers would "
                "get only one. Rename one of them, or save it in one place."
            )
        params.update(from_data)
    for logger in trainer.loggers:
        if params:
            logger.log_hyperparams(params)
        log_graph = getattr(logger, "log_graph", None)
        if log_graph is not None:
            log_graph(module)
