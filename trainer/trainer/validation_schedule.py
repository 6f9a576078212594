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
from trainer.trainer.evaluation_loop import run_eval_epoch
from trainer.trainer.options import overrides, safe_len

if TYPE_CHECKING:
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["has_validation", "run_sanity_check", "should_validate_epoch", "val_check_batches"]


def run_sanity_check(trainer: Trainer, run: Run) -> None:
    """A few validation batches of each loader before training (``num_sanity_val_steps``);
    nothing is logged."""
    loaders = run.loaders.get("validation")
    if trainer.num_sanity_val_steps == 0 or not has_validation(trainer, run):
        return
    full_limits = [loader.limit for loader in loaders]
    steps = trainer.num_sanity_val_steps
    for loader, full in zip(loaders, full_limits, strict=True):
        loader.limit = None if steps < 0 else min(steps, full if full is not None else steps)
    trainer.sanity_checking = True
    full_count = trainer.num_val_batches
    trainer.num_val_batches = sum(safe_len(loader) for loader in loaders)
    try:
        run.hooks.call("on_sanity_check_start")
        run_eval_epoch(trainer, run, "validation")
        run.hooks.call("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        for loader, full in zip(loaders, full_limits, strict=True):
            loader.limit = full
        trainer.num_val_batches = full_count
        run.stores["validation"].reset()  # sanity values are not real metrics
        trainer._callback_metrics.clear()  # nor what callbacks put beside them (Lightning)


def has_validation(trainer: Trainer, run: Run) -> bool:
    """Whether fit validates at all: a validation loader and a ``validation_step``."""
    return run.loaders.get("validation") is not None and overrides(
        trainer.module, "validation_step"
    )


def val_check_batches(trainer: Trainer, run: Run) -> int:
    """Run validation every this many train batches inside the epoch (0: only at the end)."""
    if not has_validation(trainer, run):
        return 0
    interval = trainer.val_check_interval
    if isinstance(interval, int):
        if interval > trainer.num_training_batches:
            raise ConfigurationError(
                f"Trainer(val_check_interval={interval}) is more than the "
                f"{trainer.num_training_batches} training batches per epoch. Use a smaller "
                "int, or a float fraction of the epoch."
            )
        return interval
    if interval >= 1.0 or math.isinf(trainer.num_training_batches):
        return 0
    return max(1, int(trainer.num_training_batches * interval))


def should_validate_epoch(trainer: Trainer, run: Run) -> bool:
    """Whether the current epoch validates (``check_val_every_n_epoch``, batches to validate)."""
    if not has_validation(trainer, run) or trainer.num_val_batches == 0:
        return False
    every = trainer.check_val_every_n_epoch
    return every is None or (trainer.progress.epoch + 1) % every == 0
