"""DataModule: the data of a run (download once, datasets per stage, dataloaders), with
Lightning's ``from_datasets`` and ``load_from_checkpoint``."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.trainer.data_hooks import DataHooks
from trainer.trainer.hyperparameters import HyperparameterMixin
from trainer.trainer.module_loading import load_datamodule, restricted_classmethod

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["DataModule"]

_STAGES = ("train", "val", "test", "predict")


class DataModule(HyperparameterMixin, DataHooks):
    """The data of a run: download once, build datasets per stage, hand out dataloaders.

    Override ``setup(stage)`` and the ``*_dataloader`` methods you need; ``state_dict`` /
    ``load_state_dict`` carry state through checkpoints.
    """

    prepare_data_per_node: bool = True  # False: prepare_data on global rank zero only
    name: str | None = None  # Lightning's attribute (a name for the data, unused by the Trainer)

    def __init__(self) -> None:
        self.trainer: Trainer | None = None

    def prepare_data(self) -> None:
        """Download or preprocess once per machine (local rank zero; global rank zero only with
        ``prepare_data_per_node = False``) before ``setup``; every process waits for it."""

    def setup(self, stage: str) -> None:
        """Build datasets for ``stage`` ("fit", "validate", "test" or "predict")."""

    def teardown(self, stage: str) -> None:
        """Release what ``setup`` built."""

    def on_exception(self, exception: BaseException) -> None:
        """Called when a Trainer call fails, after the callbacks' ``on_exception``."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""

    @restricted_classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike[str],
        hparams_file: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> Self:
        """A new DataModule of this class, built from the hyperparameters it recorded in the
        checkpoint (``kwargs`` override them), with its ``state_dict`` loaded back.

        Raises:
            CheckpointError: the checkpoint fails verification.
            ConfigurationError: called on an instance, or ``__init__`` needs an argument that
                neither the checkpoint nor ``kwargs`` holds.
        """
        return load_datamodule(cls, checkpoint_path, hparams_file, kwargs)  # type: ignore[return-value]

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Dataset | Iterable[Dataset] | None = None,
        val_dataset: Dataset | Iterable[Dataset] | None = None,
        test_dataset: Dataset | Iterable[Dataset] | None = None,
        predict_dataset: Dataset | Iterable[Dataset] | None = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> Self:
        """A DataModule whose ``*_dataloader`` methods wrap these datasets, as Lightning's.

        Each dataset (or each one of a list / tuple / dict of them, kept in that shape) becomes
        a ``DataLoader(dataset, batch_size, num_workers=...)``, shuffled for training (unless
        iterable), with ``pin_memory`` when CUDA is available. ``batch_size`` and
        ``num_workers`` also go to ``__init__`` when it takes them, with ``datamodule_kwargs``.
        """
        accepted = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        sizes = {"batch_size": batch_size, "num_workers": num_workers}
        datamodule = cls(
            **datamodule_kwargs,
            **{k: v for k, v in sizes.items() if takes_any or k in accepted},
        )
        pin_memory = torch.cuda.is_available()

        def loaders(data: Any, shuffle: bool) -> Any:
            if isinstance(data, Dataset):
                return DataLoader(
                    data,
                    batch_size=batch_size,
                    shuffle=shuffle and not isinstance(data, IterableDataset),
                    num_workers=num_workers,
                    pin_memory=pin_memory,
                )
            if isinstance(data, Mapping):
                return {key: loaders(value, shuffle) for key, value in data.items()}
            return type(data)(loaders(value, shuffle) for value in data)

        given = (train_dataset, val_dataset, test_dataset, predict_dataset)
        for stage, data in zip(_STAGES, given, strict=True):
            if data is not None:
                is_train = stage == "train"
                setattr(
                    datamodule,
                    f"{stage}_dataloader",
                    lambda data=data, is_train=is_train: loaders(data, is_train),
                )
        return datamodule
