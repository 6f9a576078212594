"""The Callback base class: every hook the Trainer calls, as a no-op.

A callback observes the Trainer through its public attributes and these hooks only. The Trainer
calls each callback's hook in list order, then the TrainModule's (Lightning 2.6's order, DESIGN §3;
the exceptions are listed in `trainer.trainer.hooks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["Callback", "Checkpoint", "TunerExit"]


class Callback:
    """Base class for callbacks; override the hooks you need.

    The evaluation batch hooks (``on_validation_batch_start`` / ``_end``, ``on_test_batch_*``,
    ``on_predict_batch_*``) end with ``dataloader_idx: int = 0``, as Lightning's do: with several
    dataloaders the Trainer passes the index of the one the batch came from; with one it passes
    none, so the default applies.

    Examples:
        >>> class PrintLoss(Callback):
        ...     def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        ...         if batch_idx % 100 == 0:
        ...             print(trainer.global_step, float(outputs["loss"]))
    """

    @property
    def state_key(self) -> str:
        """Key of this callback's ``state_dict`` in a checkpoint; unique per class and arguments."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints (JSON-able values and tensors)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None: ...
    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None: ...
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_sanity_check_end(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None: ...

    def on_train_batch_start(
        self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int
    ) -> None: ...

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...

    def on_before_backward(
        self, trainer: Trainer, module: TrainModule, loss: torch.Tensor
    ) -> None: ...

    def on_after_backward(self, trainer: Trainer, module: TrainModule) -> None: ...

    def on_before_optimizer_step(
        self, trainer: Trainer, module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None: ...

    def on_before_zero_grad(
        self, trainer: Trainer, module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None: ...

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_validation_epoch_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_validation_epoch_end(self, trainer: Trainer, module: TrainModule) -> None: ...

    def on_validation_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_test_epoch_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_test_epoch_end(self, trainer: Trainer, module: TrainModule) -> None: ...

    def on_test_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_test_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_predict_end(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_predict_epoch_start(self, trainer: Trainer, module: TrainModule) -> None: ...
    def on_predict_epoch_end(self, trainer: Trainer, module: TrainModule) -> None: ...

    def on_predict_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_save_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None: ...

    def on_load_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None: ...

    def on_exception(
        self, trainer: Trainer, module: TrainModule, exception: BaseException
    ) -> None: ...


class Checkpoint(Callback):
    """The base of checkpoint-writing callbacks (Lightning's ``Checkpoint``).

    The Trainer places every Checkpoint after the other callbacks, so it sees what they did in
    the same hook, and lists it in ``trainer.checkpoint_callbacks``: subclass it for a callback
    of your own that writes checkpoints. `trainer.callbacks.ModelCheckpoint` and
    `trainer.callbacks.OnExceptionCheckpoint` are Checkpoints.
    """


class TunerExit(BaseException):  # a signal, not an error: Lightning's _TunerExitException
    """Raised from ``on_fit_start`` to end ``fit`` there, cleanly: teardown runs as after a
    finished fit, ``on_exception`` does not. `trainer.callbacks.Tuner`'s finders raise it once
    their search is done."""
