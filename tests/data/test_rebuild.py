"""Loader copies keep the user's settings; torchdata's StatefulDataLoader is recognised and kept."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from trainer.data.rebuild import is_stateful_loader, rebuild_loader, to_stateful_loader
from trainer.errors import MissingDependencyError


def _init(worker_id: int) -> None:
    pass


def test_a_copy_keeps_workers_init_fn_collate_and_persistence():
    loader = DataLoader(
        list(range(8)), batch_size=2, num_workers=2, persistent_workers=True,
        worker_init_fn=_init, collate_fn=list, prefetch_factor=3, pin_memory=False,
    )  # fmt: skip
    sampler = BatchSampler(SequentialSampler(range(8)), 4, False)
    copy = rebuild_loader(loader, batch_sampler=sampler)
    assert copy.batch_sampler is sampler and copy.dataset is loader.dataset
    assert (copy.num_workers, copy.persistent_workers, copy.prefetch_factor) == (2, True, 3)
    assert copy.worker_init_fn is _init and copy.collate_fn is list
    assert not rebuild_loader(loader, persistent_workers=False).persistent_workers


def test_a_stateful_loader_stays_stateful():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(list(range(8)), batch_size=2, snapshot_every_n_steps=3)
    assert is_stateful_loader(loader) and not is_stateful_loader(DataLoader(range(4)))
    copy = rebuild_loader(loader, batch_sampler=BatchSampler(SequentialSampler(range(8)), 4, False))
    assert is_stateful_loader(copy) and copy.snapshot_every_n_steps == 3
    converted = to_stateful_loader(DataLoader(list(range(8)), batch_size=2))
    assert is_stateful_loader(converted) and to_stateful_loader(converted) is converted
    assert [b.tolist() for b in converted] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_converting_without_torchdata_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'trainer\[stateful\]'"):
        to_stateful_loader(DataLoader(torch.arange(4)))
