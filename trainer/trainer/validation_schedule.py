"""When validation runs inside ``fit``: the sanity check, ``val_check_interval``,
``check_val_every_n_epoch``.

The fit loop (`trainer.trainer.fit_loop`) asks these before and after each batch and at each
epoch end; one validation epoch itself is `trainer.trainer.evaluation_loop.run_eval_epoch`.
Nothing here changes progress.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainer.errors import ConfigurationError
from trainer.trainer.durations import val_check_seconds
from trainer.trainer.evaluation_loop import run_eval_epoch
from trainer.trainer.options import overrides

if TYPE_CHECKING:
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = [
    "has_validation",
    "is_val_check_batch",
    "run_sanity_check",
    "should_validate_epoch",
    "val_check_batches",
]


def run_sanity_check(trainer: Trainer, run: Run) -> None:
    """A few validation batches of each loader before training (``num_sanity_val_steps``);
    nothing is logged. Skipped, as in Lightning, when ``fit`` resumed from a checkpoint taken
    inside an epoch or with ``max_steps`` set."""
    loaders = run.loaders.get("validation")
    if trainer.num_sanity_val_steps == 0 or not has_validation(trainer, run):
        return
    if run.is_resumed and (trainer.max_steps != -1 or _continues_an_epoch(trainer)):
        return  # Lightning's loops are "restarting" then: its sanity check is skipped
    full_limits = [loader.limit for loader in loaders]
    steps = trainer.num_sanity_val_steps
    for loader, full in zip(loaders, full_limits, strict=True):
        # -1 ("all") is all the batches validation would run: limit_val_batches / overfit_batches
        loader.limit = full if steps < 0 else min(steps, full if full is not None else steps)
    trainer.sanity_checking = True  # num_val_batches keeps the full count (Lightning's)
    try:
        with trainer.state.running_as("sanity_check"):
            run.hooks.call("on_sanity_check_start")
            run_eval_epoch(trainer, run, "validation")
            run.hooks.call("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        for loader, full in zip(loaders, full_limits, strict=True):
            loader.limit = full
        run.stores["validation"].reset()  # sanity values are not real metrics
        run.callback_metrics.clear()  # nor what callbacks put beside them (Lightning)


def _continues_an_epoch(trainer: Trainer) -> bool:
    """The restored progress stands inside an epoch: batches done, ``on_train_epoch_end`` not
    begun (a checkpoint from ``every_n_train_steps``, or one saved after the epoch's last
    validation)."""
    progress = trainer.progress
    if progress.is_epoch_ending is None:  # an older checkpoint: its epoch ended with its batches
        return 0 < progress.batch_idx < trainer.num_training_batches
    return progress.batch_idx > 0 and not progress.is_epoch_ending


def has_validation(trainer: Trainer, run: Run) -> bool:
    """Whether fit validates at all: a validation loader, a ``validation_step`` and
    ``limit_val_batches`` above 0 (Lightning's ``enable_validation``: with 0, no sanity check
    and no validation hook runs)."""
    return (
        run.loaders.get("validation") is not None
        and overrides(trainer.module, "validation_step")
        and trainer.limit_val_batches > 0
    )


def val_check_batches(trainer: Trainer, run: Run) -> int:
    """Validate after every this many train batches (0: after an epoch's last batch only).

    Lightning's ``val_check_batch``: an int ``val_check_interval`` as given, a float that
    fraction of the epoch's batches (at least 1; 1.0 is the whole epoch); 0 when the loader has
    no length and the interval is 1.0, and for a duration (`val_check_seconds` decides). The batches are counted inside the epoch, or over the
    whole fit with ``check_val_every_n_epoch=None`` (`is_val_check_batch`).

    Raises:
        ConfigurationError: an int interval longer than the epoch while
            ``check_val_every_n_epoch`` counts epochs, or a fraction other than 1.0 of a loader
            without length (Lightning's checks).
    """
    if not has_validation(trainer, run) or val_check_seconds(trainer) is not None:
        return 0
    interval = trainer.val_check_interval
    batches = trainer.num_training_batches
    if isinstance(interval, int):
        limit = trainer.limit_batches["validation"]
        if (
            interval > batches
            and trainer.check_val_every_n_epoch is not None
            and (limit is None or limit > 0)
        ):
            raise ConfigurationError(
                f"Trainer(val_check_interval={interval}) is more than the {batches} training "
                "batches per epoch. Use a smaller int, a float fraction of the epoch, or "
                "check_val_every_n_epoch=None to count batches over the whole fit."
            )
        return interval
    if math.isinf(batches):
        if interval != 1.0:  # a fraction of an epoch of unknown length
            raise ConfigurationError(
                f"Trainer(val_check_interval={interval}): the training dataloader has no length "
                "(an IterableDataset), so a fraction of its epoch cannot be counted. Pass an "
                "int number of training batches, a duration such as '00:00:10:00', 1.0 for the "
                "end of each epoch, or set limit_train_batches to an int."
            )
        return 0
    return max(1, int(batches * interval))


def is_val_check_batch(trainer: Trainer, every: int, batch_idx: int, *, is_last: bool) -> bool:
    """Whether the batch ``batch_idx`` just trained is one validation follows (Lightning's
    ``_should_check_val_fx`` for batch intervals; the epoch and ``should_stop`` are the
    caller's). ``every`` is `val_check_batches`' answer."""
    if not every:
        return is_last
    if trainer.check_val_every_n_epoch is None:  # counted over the whole fit
        return trainer.progress.total_batches % every == 0
    return (batch_idx + 1) % every == 0


def should_validate_epoch(trainer: Trainer, run: Run) -> bool:
    """Whether the current epoch validates (``check_val_every_n_epoch``, batches to validate)."""
    if not has_validation(trainer, run) or trainer.num_val_batches == 0:
        return False
    every = trainer.check_val_every_n_epoch
    return every is None or (trainer.progress.epoch + 1) % every == 0
