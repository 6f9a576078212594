"""BasePredictionWriter: the base of callbacks that write ``predict`` outputs somewhere.

This module owns when a writer is called (after each predict batch, at the predict epoch end,
or both) and what it receives. Where and how predictions are stored is the subclass's business.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["BasePredictionWriter", "WriteInterval"]


class WriteInterval(str, enum.Enum):
    """When a `BasePredictionWriter` writes."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    """Subclass to write predictions as ``trainer.predict`` produces them.

    Implement `write_on_batch_end` (``write_interval="batch"``), `write_on_epoch_end`
    (``"epoch"``), or both (``"batch_and_epoch"``). ``batch_indices`` are the dataset indices
    of the batch's samples, as the sampler drew them (Lightning's): shuffled, or this process's
    share on several processes, they still say which sample each prediction belongs to. A loader
    without index batches (an iterable dataset) gives the positions in the order this process
    received them. Add ``trainer.global_rank`` to file names.

    Args:
        write_interval: ``"batch"``, ``"epoch"`` or ``"batch_and_epoch"``.

    Raises:
        ConfigurationError: ``write_interval`` is not one of those, or the subclass does not
            implement the method that interval calls.

    Examples:
        >>> class TorchWriter(BasePredictionWriter):
        ...     def __init__(self, output_dir):
        ...         super().__init__(write_interval="epoch")
        ...         self.output_dir = output_dir
        ...
        ...     def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        ...         path = f"{self.output_dir}/predictions_{trainer.global_rank}.pt"
        ...         torch.save(torch.cat(predictions), path)
        >>> # Trainer(callbacks=[TorchWriter("out")]).predict(module, loader) writes out/predictions_0.pt
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in {interval.value for interval in WriteInterval}:
            raise ConfigurationError(
                f"{type(self).__name__}(write_interval={describe(write_interval)}): expected one "
                f"of {[interval.value for interval in WriteInterval]}."
            )
        self.interval = WriteInterval(write_interval)
        for method, is_needed in (
            ("write_on_batch_end", self.interval.on_batch),
            ("write_on_epoch_end", self.interval.on_epoch),
        ):
            if is_needed and getattr(type(self), method) is getattr(BasePredictionWriter, method):
                raise ConfigurationError(
                    f"{type(self).__name__}(write_interval={write_interval!r}) does not "
                    f"implement {method}. Implement it, or choose another write_interval."
                )
        self._predictions: list[list[Any]] = []  # per dataloader
        self._batch_indices: list[list[list[int]]] = []  # per dataloader, per batch
        self._seen = 0

    def write_on_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Write one batch's ``prediction`` (what ``predict_step`` returned)."""
        raise NotImplementedError(
            f"{type(self).__name__} has write_interval={self.interval.value!r} but does not "
            "implement write_on_batch_end(trainer, module, prediction, batch_indices, batch, "
            "batch_idx, dataloader_idx)."
        )

    def write_on_epoch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any],
    ) -> None:
        """Write all ``predictions`` of the epoch (one per batch) with their ``batch_indices``.

        As in Lightning, ``batch_indices`` has one entry per dataloader, a list of each batch's
        indices: ``[[[0, 1, 2, 3], [4, 5, 6, 7]]]`` for one dataloader of two batches of 4. With
        several dataloaders ``predictions`` has one list per dataloader too.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has write_interval={self.interval.value!r} but does not "
            "implement write_on_epoch_end(trainer, module, predictions, batch_indices)."
        )

    def on_predict_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._predictions, self._batch_indices, self._seen = [], [], 0

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        while len(self._batch_indices) <= dataloader_idx:  # a new dataloader numbers from 0
            self._predictions.append([])
            self._batch_indices.append([])
            self._seen = 0
        size = _batch_size(batch)
        # The dataset indices the sampler drew (Lightning's); positions when it drew none.
        indices = trainer.predict_batch_indices
        if indices is None or len(indices) != size:
            indices = list(range(self._seen, self._seen + size))
        self._seen += size
        if self.interval.on_epoch:
            self._predictions[dataloader_idx].append(outputs)
            self._batch_indices[dataloader_idx].append(indices)
        if self.interval.on_batch:
            self.write_on_batch_end(
                trainer, module, outputs, indices, batch, batch_idx, dataloader_idx
            )

    def on_predict_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self.interval.on_epoch:
            predictions, indices = self._predictions or [[]], self._batch_indices or [[]]
            self._predictions, self._batch_indices = [], []
            # Lightning's shapes: one dataloader's predictions as a flat list, several as one
            # list each; the indices always one list per dataloader.
            self.write_on_epoch_end(
                trainer, module, predictions[0] if len(predictions) == 1 else predictions, indices
            )


def _batch_size(batch: Any) -> int:
    """Samples in ``batch``: the length of its first tensor (1 when it holds none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            if isinstance(item, torch.Tensor | list | tuple | dict):
                return _batch_size(item)
        return len(batch)
    return 1
