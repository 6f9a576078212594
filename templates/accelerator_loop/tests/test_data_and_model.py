"""The data and the network: sizes and shapes."""

import torch

from digits_loop.data import make_loaders
from digits_loop.model import NUM_CLASSES, build_model


def test_loaders_cover_the_70_15_15_split() -> None:
    train, val, test = make_loaders(batch_size=32, eval_batch_size=100)

    assert [len(loader.dataset) for loader in (train, val, test)] == [1257, 270, 270]
    images, labels = next(iter(train))
    assert images.shape == (32, 1, 8, 8) and labels.shape == (32,)


def test_model_maps_images_to_class_logits() -> None:
    assert build_model()(torch.zeros(3, 1, 8, 8)).shape == (3, NUM_CLASSES)
