"""Data layer: prepared dataloaders, batch skipping, device transfer."""

from trainer.data.loader import (
    DataLoaderShard,
    SkipBatchSampler,
    send_to_device,
    skip_first_batches,
)

__all__ = ["DataLoaderShard", "SkipBatchSampler", "send_to_device", "skip_first_batches"]
