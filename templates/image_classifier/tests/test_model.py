"""The network: shapes and size."""

import torch

from digits_classifier.model import NUM_CLASSES, build_model


def test_model_maps_a_batch_of_images_to_class_logits() -> None:
    logits = build_model()(torch.zeros(5, 1, 8, 8))

    assert logits.shape == (5, NUM_CLASSES)


def test_model_has_the_documented_size() -> None:
    count = sum(p.numel() for p in build_model().parameters())

    assert 140_000 < count < 160_000
