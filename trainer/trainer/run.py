"""What one ``fit`` / ``validate`` / ``test`` / ``predict`` call set up, and where training stands.

`Progress` and `TrainerState` are public (``trainer.progress``, ``trainer.state``). `Run` is
what ``Trainer._setup`` hands the loops explicitly: the hook table, the prepared loaders, the
metric stores and the prepared model's step functions, so no loop reads the Trainer's private
fields.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.trainer.hook_table import HookTable
    from trainer.trainer.metrics import MetricStore

__all__ = ["Progress", "Run", "TrainerState"]


@dataclass
class Progress:
    """Where training stands; saved as-is in checkpoints. One counter per fact."""

    epoch: int = 0  # epochs completed; the current epoch's index while training
    global_step: int = 0  # optimizer steps taken
    batch_idx: int = 0  # next batch index inside the current epoch
    last_val_step: int = -1  # global step of the last validation during fit
    # Training batches started in the whole fit (Lightning's total_batch_idx + 1): what
    # val_check_interval counts with check_val_every_n_epoch=None.
    total_batches: int = 0
    # Batches that stepped (automatic optimization: = global_step) or ran (manual optimization,
    # where global_step counts every optimizer's steps): the step loggers write rows at.
    batches_stepped: int = 0
    # on_train_epoch_end has begun (Lightning's epoch "processed"): the epoch's batches and its
    # end-of-epoch validation are done. A run resumed before this point continues its epoch
    # (validation, on_train_epoch_end) and skips the sanity check, as Lightning's does; one
    # resumed after it finishes the epoch (its ReduceLROnPlateau step) and goes on with the next.
    # None: restored from a checkpoint written before this field existed.
    is_epoch_ending: bool | None = False


@dataclass
class TrainerState:
    """What the Trainer is doing: the call (``stage``: "fit", "validate", "test", "predict";
    Lightning's ``state.fn``), its status, and what runs inside it (``running``: "train",
    "sanity_check", "validate", "test", "predict"; Lightning's ``state.stage``)."""

    stage: str | None = None
    status: str = "initializing"  # "running", "finished", "interrupted", "failed"
    running: str | None = field(default=None, repr=False)  # the repr stays (stage, status)

    @property
    def fn(self) -> str | None:
        """Lightning's name for `stage`: the call running."""
        return self.stage

    @contextlib.contextmanager
    def running_as(self, running: str) -> Iterator[None]:
        """`running` is ``running`` inside the block, what it was before after it."""
        previous, self.running = self.running, running
        try:
            yield
        finally:
            self.running = previous


@dataclass
class Run:
    """The pieces one call of the Trainer set up, shared by the fit and evaluation loops."""

    hooks: HookTable
    # "train" -> the prepared loader; "validation" / "test" / "predict" -> a list of them
    loaders: dict[str, Any]
    given_stages: frozenset[str]  # the stages whose loaders the call received: never rebuilt
    stores: dict[str, MetricStore]  # "train" / "validation" / "test" -> self.log's store
    model: torch.nn.Module  # the prepared (engine-wrapped) model: train() / eval() on it
    run_step: Callable[..., Any]  # run_step("validation_step", batch, batch_idx)
    training_step: Callable[..., Any] | None
    # The dict ``trainer.callback_metrics`` returns (what callbacks put beside logged values).
    callback_metrics: dict[str, torch.Tensor]
    keep_predictions: bool = True  # predict(return_predictions=False): outputs are not kept
    is_resumed: bool = False  # fit restored a checkpoint's progress (ckpt_path)
