"""The data: split sizes, stratification, scaling."""

import torch

from digits_classifier.data import DigitsDataModule, load_digit_splits


def test_splits_are_70_15_15_and_disjoint() -> None:
    splits = load_digit_splits(seed=0)

    assert {name: len(split) for name, split in splits.items()} == {
        "train": 1257,
        "val": 270,
        "test": 270,
    }
    images = torch.cat([split.tensors[0] for split in splits.values()]).flatten(1)
    assert torch.unique(images, dim=0).shape[0] > 1700  # almost no image appears twice


def test_every_split_holds_every_digit_and_pixels_are_in_0_1() -> None:
    for split in load_digit_splits(seed=0).values():
        images, labels = split.tensors
        assert set(labels.tolist()) == set(range(10))
        assert images.min() >= 0.0 and images.max() <= 1.0


def test_datamodule_hands_out_shuffled_train_and_ordered_eval_loaders() -> None:
    data = DigitsDataModule(batch_size=32, eval_batch_size=100)
    data.setup("fit")

    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (32, 1, 8, 8) and labels.shape == (32,)
    assert len(data.val_dataloader()) == 3  # 270 images in batches of 100
    assert len(data.test_dataloader()) == 3
