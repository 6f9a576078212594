"""trainer/data/index_recording.py: the index batches a loader yields, taken back in order."""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from trainer.data.index_recording import IndexRecorder, record_indices
from trainer.data.loader import DataLoaderShard


def test_each_batch_gets_its_own_indices_with_workers_reading_ahead():
    data = torch.arange(20.0)
    sampler = BatchSampler(RandomSampler(data), batch_size=3, drop_last=False)
    recorder = IndexRecorder(sampler)
    loader = DataLoader(data, batch_sampler=recorder, num_workers=2, prefetch_factor=2)
    for _ in range(2):  # a second pass starts afresh
        seen = []
        for batch in loader:  # the workers have drawn several batches ahead by now
            indices = recorder.take()
            assert batch.long().tolist() == indices
            seen.extend(indices)
        assert sorted(seen) == list(range(20)) and recorder.take() is None
    assert len(recorder) == 7 and recorder.batch_size == 3  # the wrapped sampler's


def test_record_indices_on_a_prepared_loader_and_an_iterable_one():
    prepared = DataLoaderShard(DataLoader(torch.arange(6.0), batch_size=4, shuffle=True))
    recorder = record_indices(prepared)
    pairs = [(batch.long().tolist(), recorder.take()) for batch in prepared]
    assert [len(batch) for batch, _ in pairs] == [4, 2]
    assert all(batch == indices for batch, indices in pairs)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert record_indices(DataLoaderShard(DataLoader(Stream(), batch_size=None))) is None
