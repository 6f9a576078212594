"""The data: scikit-learn's digits split 70/15/15, as plain ``DataLoader`` objects.

``sklearn.datasets.load_digits()`` is 1,797 greyscale 8x8 images, bundled in the scikit-learn
wheel: nothing is downloaded. The loaders are ordinary; ``accelerator.prepare`` shards them.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["load_digit_splits", "make_loaders"]


def load_digit_splits(seed: int) -> dict[str, TensorDataset]:
    """The digits as ``{"train", "val", "test"}`` datasets (1,257 / 270 / 270 images).

    Stratified by class with a fixed ``seed``; pixels (0-16) scaled to [0, 1].
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


def make_loaders(
    batch_size: int, eval_batch_size: int, split_seed: int = 0
) -> tuple[DataLoader, DataLoader, DataLoader]:
    """Train (shuffled), validation and test loaders over the digits.

    Example:
        >>> train, val, test = make_loaders(batch_size=32, eval_batch_size=256)
        >>> len(train), len(val), len(test)
        (40, 2, 2)
    """
    splits = load_digit_splits(split_seed)
    return (
        DataLoader(splits["train"], batch_size=batch_size, shuffle=True),
        DataLoader(splits["val"], batch_size=eval_batch_size),
        DataLoader(splits["test"], batch_size=eval_batch_size),
    )
