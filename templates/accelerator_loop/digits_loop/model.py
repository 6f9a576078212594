"""The network, plain ``torch.nn``: nothing here knows about training."""

from __future__ import annotations

from torch import nn

__all__ = ["IMAGE_SIZE", "NUM_CLASSES", "build_model"]

NUM_CLASSES = 10
IMAGE_SIZE = 8  # the digits are 1 x 8 x 8 greyscale images


def build_model(dropout: float = 0.25, hidden: int = 128) -> nn.Module:
    """A two-layer CNN for 1x8x8 images: 8x8 -> 4x4 feature maps -> 10 logits (151k parameters).

    Example:
        >>> import torch
        >>> build_model()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """
    return nn.Sequential(
        nn.Conv2d(1, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(64 * (IMAGE_SIZE // 2) ** 2, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, NUM_CLASSES),
    )
