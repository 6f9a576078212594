"""Resuming from a PyTorch Lightning ``.ckpt``: its loop counters in this Trainer's terms.

A Lightning checkpoint already holds ``state_dict``, ``optimizer_states``, ``lr_schedulers``,
``epoch`` and ``global_step`` under the names this Trainer uses. Where training stood is kept in
Lightning's loop objects (``loops["fit_loop"]``); `from_lightning` turns that into the
``progress`` record the Trainer restores. Lightning's callback and loop states are dropped: they
belong to Lightning's classes (a ``ModelCheckpoint`` state there points at ``.ckpt`` files).
"""

from __future__ import annotations

import os
from typing import Any

from trainer.checkpoint.schema import check_lightning

__all__ = ["from_lightning", "is_lightning_checkpoint"]

_LIGHTNING_ONLY_KEYS = ("loops", "callbacks", "pytorch-lightning_version")


def is_lightning_checkpoint(checkpoint: dict[str, Any]) -> bool:
    """Whether ``checkpoint`` was written by PyTorch Lightning's ``Trainer.save_checkpoint``."""
    return "pytorch-lightning_version" in checkpoint


def from_lightning(
    checkpoint: dict[str, Any], *, source: str | os.PathLike[str] = "Lightning checkpoint"
) -> dict[str, Any]:
    """``checkpoint`` with Lightning's loop state replaced by this Trainer's ``progress``.

    The batch position is the number of training batches Lightning had *processed* in the
    current epoch: its ``ModelCheckpoint`` saves in ``on_train_batch_end``, after a batch is
    processed and before it counts as completed. A checkpoint taken at the end of an epoch counts
    as validated, so the resumed run does not validate that epoch again; one taken mid-epoch
    does not (the next scheduled validation runs as usual).

    Raises:
        CheckpointError: a loop counter read here has the wrong type or range
            (`trainer.checkpoint.schema.check_lightning`), naming ``source``, field and value.
    """
    check_lightning(checkpoint, source=os.fspath(source))
    converted = {k: v for k, v in checkpoint.items() if k not in _LIGHTNING_ONLY_KEYS}
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop")
    if not isinstance(fit_loop, dict):  # weights only (save_weights_only=True)
        return converted
    batches = fit_loop.get("epoch_loop.batch_progress") or {}
    global_step = checkpoint.get("global_step", 0)
    is_epoch_end = batches.get("is_last_batch", False)
    converted["progress"] = {
        "epoch": checkpoint.get("epoch", 0),
        "global_step": global_step,
        "batch_idx": (batches.get("current") or {}).get("processed", 0),
        "last_val_step": global_step if is_epoch_end else -1,
    }
    return converted
