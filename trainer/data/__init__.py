"""Data layer: prepared dataloaders, batch skipping, device transfer, seeded reads, sharding.

``loader.py`` (DataLoaderShard), ``sharding.py`` (a process's share), ``seeding.py`` (what a
dataset draws is a function of the batch's place), ``generators.py`` (the global generators'
states), ``rebuild.py`` (loader copies; torchdata's StatefulDataLoader), ``transfer.py``
(``send_to_device``), ``fetch.py`` (a plain loader's batches read without torch's per-batch
profiler record).
"""

from trainer.data.combined import CombinedLoader
from trainer.data.loader import (
    DataLoaderShard,
    SkipBatchSampler,
    skip_first_batches,
)
from trainer.data.transfer import send_to_device

__all__ = [
    "CombinedLoader",
    "DataLoaderShard",
    "SkipBatchSampler",
    "send_to_device",
    "skip_first_batches",
]
