"""trainer/data/fetch.py: reading a plain loader here gives what torch's iterator gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

from trainer.data.fetch import is_read_here, iterate
from trainer.data.loader import DataLoaderShard


class _Augmenting(Dataset):
    """Each read draws from torch's global generator, as a random augmentation does."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), float(index)) + torch.rand(2)


class _EndsEarly(Dataset):
    """Says it has 10 samples but ends the pass at the 5th (torch's fetcher allows it)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index >= 5:
            raise StopIteration
        return index


def _pairs(batch: list[Any]) -> list[Any]:
    return [(index, value) for index, value in enumerate(batch)]


def _loaders() -> dict[str, Any]:
    tensors = TensorDataset(torch.arange(22.0).reshape(11, 2), torch.arange(11))
    return {
        "in order": lambda: DataLoader(tensors, batch_size=3),
        "shuffled by torch's generator": lambda: DataLoader(tensors, batch_size=3, shuffle=True),
        "shuffled by its own generator": lambda: DataLoader(
            tensors, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)
        ),
        "drop_last": lambda: DataLoader(tensors, batch_size=3, drop_last=True),
        "a Subset (__getitems__)": lambda: DataLoader(Subset(tensors, [4, 1, 7, 2]), batch_size=3),
        "augmenting, shuffled": lambda: DataLoader(_Augmenting(), batch_size=4, shuffle=True),
        "own collate_fn": lambda: DataLoader(tensors, batch_size=5, collate_fn=_pairs),
        "ends early": lambda: DataLoader(_EndsEarly(), batch_size=2),
    }


def _read(make_loader: Any, read: Any, batches: int | None) -> tuple[list[Any], torch.Tensor]:
    torch.manual_seed(3)
    iterator = read(make_loader())
    taken = []
    for batch in iterator:
        if batches is not None and len(taken) == batches:
            break
        taken.append(batch)
    return taken, torch.get_rng_state()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("batches", [None, 1, 0])
@pytest.mark.parametrize("name", list(_loaders()))
def test_batches_and_torchs_generator_end_as_with_torchs_iterator(name: str, batches: Any) -> None:
    make_loader = _loaders()[name]
    assert is_read_here(make_loader())
    expected, expected_state = _read(make_loader, iter, batches)
    got, state = _read(make_loader, iterate, batches)
    assert _same(got, expected)
    assert torch.equal(state, expected_state)  # the iterator's draw, the sampler's, the reads'
    if batches is None and name == "ends early":
        assert [batch.tolist() for batch in got] == [[0, 1], [2, 3]]


def test_a_prepared_loader_yields_torchs_batches_and_draws() -> None:
    make_loader = _loaders()["augmenting, shuffled"]
    expected, expected_state = _read(make_loader, iter, None)
    got, state = _read(make_loader, lambda loader: iter(DataLoaderShard(loader)), None)
    assert _same(got, expected) and torch.equal(state, expected_state)


class _Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(4))


class _OwnLoader(DataLoader):
    pass


@pytest.mark.parametrize(
    "make_loader",
    [
        lambda data: DataLoader(data, batch_size=2, num_workers=1),
        lambda data: DataLoader(data, batch_size=2, pin_memory=True),
        lambda data: DataLoader(data, batch_size=None),
        lambda data: DataLoader(_Stream(), batch_size=2),
        lambda data: _OwnLoader(data, batch_size=2),
    ],
    ids=["workers", "pin_memory", "no batching", "iterable data", "a DataLoader subclass"],
)
def test_other_loaders_are_read_by_torch(make_loader: Any) -> None:
    loader = make_loader(TensorDataset(torch.arange(4.0)))
    assert not is_read_here(loader)
    iterator = iterate(loader)
    assert type(iterator).__module__ == "torch.utils.data.dataloader"
    del iterator


def test_a_timeout_without_workers_gets_torchs_refusal() -> None:
    loader = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2, timeout=5)
    assert not is_read_here(loader)
    with pytest.raises(AssertionError, match="timeout"):
        iterate(loader)


def test_a_running_profiler_still_records_each_fetch_under_torchs_name() -> None:
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        batches = list(iterate(loader))
    names = [event.name for event in profiler.events()]
    assert len(batches) == 4
    assert names.count("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") == 4
