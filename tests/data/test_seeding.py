"""Seeded fetching: batch seeds, the positioned batch sampler, the dataset wrappers, DataRng."""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, WeightedRandomSampler

from trainer.data import DataLoaderShard
from trainer.data.seeding import (
    DataRng,
    PositionedBatchSampler,
    SeededIterableDataset,
    SeededMapDataset,
    batch_seed,
    seed_generators,
    seeded_dataset,
)


def _draw() -> tuple[float, float, float]:
    return torch.rand(()).item(), float(np.random.rand()), random.random()


def test_batch_seed_depends_on_every_part():
    seeds = {batch_seed(7, epoch, index, rank) for epoch in range(3) for index in range(50) for rank in range(4)}  # fmt: skip
    assert len(seeds) == 3 * 50 * 4
    assert all(0 <= s < 2**64 for s in seeds)
    assert batch_seed(7, 0, 3, 0) == batch_seed(7, 0, 3, 0)


def test_seed_generators_seeds_torch_numpy_and_random():
    seed_generators(batch_seed(1, 2, 3))
    first = _draw()
    seed_generators(batch_seed(1, 2, 3))
    assert _draw() == first
    seed_generators(batch_seed(1, 2, 4))
    assert _draw() != first


def test_positioned_batches_carry_seeds_from_their_place_and_survive_pickling():
    sampler = PositionedBatchSampler([[0, 1], [2, 3], [4, 5]], rank=1)
    sampler.seed, sampler.epoch = 5, 2
    batches = list(sampler)
    assert [list(b) for b in batches] == [[0, 1], [2, 3], [4, 5]]
    assert [b.seed for b in batches] == [batch_seed(5, 2, p, 1) for p in range(3)]
    sampler.skip = 2  # a resumed epoch: the positions still count from the epoch's start
    (last,) = list(sampler)
    assert last.seed == batches[2].seed and len(sampler) == 1
    copy = pickle.loads(pickle.dumps(last))  # how it travels to a worker
    assert copy == [4, 5] and copy.seed == last.seed


class _Noisy(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[float, float, float]:
        return _draw()


def test_a_batch_reads_the_same_values_wherever_and_whenever_it_is_fetched():
    dataset = SeededMapDataset(_Noisy())
    sampler = PositionedBatchSampler([[0, 1], [2, 3]])
    batches = list(sampler)
    late = dataset.__getitems__(batches[1])
    torch.rand(5), np.random.rand(5), random.random()  # anything in between
    early = dataset.__getitems__(batches[0])
    assert dataset.__getitems__(batches[1]) == late and early != late


class _Configurable(_Noisy):
    start = 0


def test_the_wrapper_forwards_attributes_both_ways():
    inner = _Configurable()
    wrapper = seeded_dataset(inner)
    wrapper.start = 4  # as a worker_init_fn does through get_worker_info().dataset
    assert inner.start == 4 and wrapper.start == 4 and len(wrapper) == 8
    copy = pickle.loads(pickle.dumps(wrapper))
    assert copy.dataset.start == 4


def test_a_stateful_dataset_stays_stateful_and_only_then():
    class Stateful(_Noisy):
        def state_dict(self):
            return {"n": 1}

        def load_state_dict(self, state):
            self.loaded = state

    assert not hasattr(seeded_dataset(_Noisy()), "state_dict")
    wrapper = seeded_dataset(Stateful())
    assert wrapper.state_dict() == {"n": 1}


class _Stream(IterableDataset):
    def __iter__(self):
        for _ in range(4):
            yield torch.rand(()).item()


def test_an_iterable_pass_is_seeded_by_seed_and_epoch():
    stream = torch.tensor([3, 0])
    dataset = SeededIterableDataset(_Stream(), stream)
    first = list(dataset)
    assert list(dataset) == first
    stream[1] = 1  # the next epoch draws differently
    assert list(dataset) != first


def test_data_rng_keeps_the_training_streams_where_they_were():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    rng = DataRng(keeps_stream=True)
    rng.run(seed_generators, 123)
    drawn = [rng.run(torch.rand, ()) for _ in range(2)]
    assert torch.equal(torch.rand(3), expected)  # the training's draws did not move
    seed_generators(123)
    assert [torch.rand(()) for _ in range(2)] == drawn  # the data's stream went on


def test_main_process_fetches_do_not_move_the_global_generators():
    shard = DataLoaderShard(DataLoader(_Noisy(), batch_size=2, shuffle=True))
    shard.seed = 11
    torch.manual_seed(0)
    values = [torch.stack(batch).tolist() for batch in shard]
    after = torch.get_rng_state()
    torch.manual_seed(0)
    torch.empty((), dtype=torch.int64).random_()  # what a pass of torch's DataLoader takes
    assert torch.equal(after, torch.get_rng_state())  # the reads took nothing more
    shard.set_epoch(0)
    assert [torch.stack(batch).tolist() for batch in shard] == values  # the same draws


class _Indexed(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, torch.rand(()).item()


def test_a_sampler_drawing_from_the_global_generator_still_moves_it():
    """Only the reads are kept off the training's generators, not the sampler's own draws."""
    sampler = WeightedRandomSampler([1.0] * 8, 8)  # draws from torch's global generator
    shard = DataLoaderShard(DataLoader(_Indexed(), batch_size=4, sampler=sampler))
    shard.seed = 1
    torch.manual_seed(0)
    orders = [[int(i) for indices, _ in shard for i in indices] for _ in range(3)]
    assert len({tuple(order) for order in orders}) == 3
