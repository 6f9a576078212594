"""OnExceptionCheckpoint: save a checkpoint when fit raises (Lightning 2.6's callback)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trainer.callbacks.callback import Checkpoint

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["OnExceptionCheckpoint"]


class OnExceptionCheckpoint(Checkpoint):
    """Save a checkpoint when fit raises, to ``dirpath/filename``.

    Examples:
        >>> OnExceptionCheckpoint(dirpath="checkpoints", filename="on_exception")
    """

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        self.dirpath = os.fspath(dirpath)
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dirpath, self.filename)

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        if trainer.state.stage == "fit" and trainer.optimizers:
            trainer.save_checkpoint(self.ckpt_path)
