"""ProgressBar: the base class of progress bars (Lightning's), and what every bar shows.

This module owns what a bar may read from the Trainer (batch totals per stage and dataloader,
the stage descriptions) and the metrics it shows: the loggers' version as ``v_num`` and
``trainer.progress_bar_metrics``. It draws nothing: `RichProgressBar` (``progress.py``) and
`TQDMProgressBar` (``tqdm_progress.py``) do. The Trainer uses a ProgressBar found in its
callbacks instead of adding its default one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer._warnings import warn_user
from trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["ProgressBar", "get_standard_metrics"]


class ProgressBar(Callback):
    """Base class for progress bars: subclass it, and implement ``disable`` and ``enable``.

    ``setup`` keeps the Trainer (``self.trainer``) and disables the bar on every process but
    global rank zero.

    Examples:
        >>> class Percent(ProgressBar):
        ...     def disable(self): self.is_shown = False
        ...     def enable(self): self.is_shown = True
        ...     def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        ...         print(f"{100 * (batch_idx + 1) / self.total_train_batches:.1f} %")
    """

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._current_eval_dataloader_idx: int | None = None

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return self._trainer

    @property
    def sanity_check_description(self) -> str:
        return "Sanity Checking"

    @property
    def train_description(self) -> str:
        return "Training"

    @property
    def validation_description(self) -> str:
        return "Validation"

    @property
    def test_description(self) -> str:
        return "Testing"

    @property
    def predict_description(self) -> str:
        return "Predicting"

    @property
    def total_train_batches(self) -> int | float:
        """Training batches this epoch (``inf`` for an endless loader; fewer when ``max_steps``
        ends the run first and ``max_epochs=-1``)."""
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """Batches of the validation dataloader running now (sanity check: its few batches)."""
        trainer = self.trainer
        batches = trainer.num_val_batches
        if trainer.sanity_checking:
            batches = getattr(trainer, "num_sanity_val_batches", batches)
        return self._current(batches)

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        return self._current(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        return self._current(self.trainer.num_predict_batches)

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches over all dataloaders."""
        batches = self.trainer.num_val_batches
        return sum(batches) if isinstance(batches, list) else batches

    def _current(self, batches: Any) -> int | float:
        if isinstance(batches, list):
            return batches[self._current_eval_dataloader_idx or 0]
        return batches

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Whether ``dataloader_idx`` differs from the previous batch's (and remember it)."""
        previous, self._current_eval_dataloader_idx = (
            self._current_eval_dataloader_idx,
            dataloader_idx,
        )
        return previous != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        self._current_eval_dataloader_idx = None

    def disable(self) -> None:
        """Stop showing anything (called on every process but global rank zero)."""
        raise NotImplementedError

    def enable(self) -> None:
        """Show progress again."""
        raise NotImplementedError

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bar."""
        print(*args, **kwargs)

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: Trainer, module: TrainModule) -> dict[str, Any]:
        """What the bar shows after its counts: ``v_num`` and the ``prog_bar=True`` metrics.

        Override it to change the items, e.g. drop ``v_num``.
        """
        standard = get_standard_metrics(trainer)
        bar_metrics = trainer.progress_bar_metrics
        duplicates = sorted(standard.keys() & bar_metrics.keys())
        if duplicates:
            warn_user(
                f"The progress bar already tracks a metric with the name(s) '{', '.join(duplicates)}' "
                f"and `self.log('{duplicates[0]}', ..., prog_bar=True)` will overwrite this value. "
                " If this is undesired, change the name or override `get_metrics()` in the progress "
                "bar callback."
            )
        return {**standard, **bar_metrics}


def get_standard_metrics(trainer: Trainer) -> dict[str, int | str]:
    """``{"v_num": version}`` of the loggers (a str version: its last 4 characters), or ``{}``.

    Examples:
        >>> get_standard_metrics(trainer)  # one CSVLogger, version 3
        {'v_num': 3}
    """
    loggers = trainer.loggers
    if not loggers:
        return {}
    if len(loggers) == 1:
        version: Any = loggers[0].version
    else:
        version = "_".join(dict.fromkeys(str(logger.version) for logger in loggers))
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}
