"""The data: scikit-learn's digits split 70/15/15 into train/val/test, and their loaders.

``sklearn.datasets.load_digits()`` is 1,797 greyscale 8x8 images of the digits 0-9, bundled in
the scikit-learn wheel: nothing is downloaded. To train on your own images, keep the DataModule's
shape (``setup`` builds datasets, the ``*_dataloader`` methods hand out loaders) and change
``load_digit_splits``.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset
from trainer import DataModule

__all__ = ["DigitsDataModule", "load_digit_splits"]


def load_digit_splits(seed: int) -> dict[str, TensorDataset]:
    """The digits as ``{"train", "val", "test"}`` datasets of (N x 1 x 8 x 8 floats, labels).

    70/15/15 (1,257 / 270 / 270 images), stratified by class with a fixed ``seed``. Pixels
    (0-16) are scaled to [0, 1]; nothing is fitted on the validation or test images.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    index = torch.arange(len(labels)).numpy()
    train_idx, rest_idx = train_test_split(
        index, test_size=0.30, stratify=digits.target, random_state=seed
    )
    val_idx, test_idx = train_test_split(
        rest_idx, test_size=0.50, stratify=digits.target[rest_idx], random_state=seed
    )
    return {
        name: TensorDataset(images[idx], labels[idx])
        for name, idx in (("train", train_idx), ("val", val_idx), ("test", test_idx))
    }


class DigitsDataModule(DataModule):
    """The three splits and their loaders (the training loader shuffles, the others do not).

    Args:
        batch_size: training batch size per process.
        eval_batch_size: validation and test batch size per process.
        seed: the seed of the split (the shuffle is seeded by ``seed_everything``).
        num_workers: DataLoader worker processes (0: load in the main process; the data is tiny).

    Example:
        >>> data = DigitsDataModule(batch_size=32)
        >>> data.setup("fit")
        >>> len(data.train_dataloader())
        40
    """

    def __init__(
        self, batch_size: int = 64, eval_batch_size: int = 256, seed: int = 0, num_workers: int = 0
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str) -> None:
        if not self.splits:
            self.splits = load_digit_splits(self.hparams.seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.splits["train"],
            batch_size=self.hparams.batch_size,
            shuffle=True,
            num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.hparams.eval_batch_size,
            num_workers=self.hparams.num_workers,
        )
