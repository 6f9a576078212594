"""What prepared loaders take from torch's global generator (``trainer/data/draws.py``).

As torch's DataLoader under Accelerate: one value each time a pass makes torch's iterator, none
at ``prepare`` for an unshuffled loader. A loader with a seed takes one at every pass, with
persistent workers too (torch: at the first pass only). A resumed pass that continues one cut
short takes nothing, so the draws after a resume (dropout) are the uninterrupted run's. Checked
here with ``torch.rand`` draws made after every batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from tests.distributed.launch import ROOT, output_tail, torchrun
from trainer import Accelerator, DataLoaderConfiguration
from trainer.data import DataLoaderShard, skip_first_batches
from trainer.data.prepare import prepare_loader_shard
from trainer.errors import CheckpointError

DATA = TensorDataset(torch.arange(12.0))


def _draws(loader: Iterable[Any], epochs: int = 3) -> list[float]:
    """A ``torch.rand`` draw after every batch (as dropout would), and one after the last pass."""
    drawn = [torch.rand(()).item() for _ in range(epochs) for _ in loader]
    return [*drawn, torch.rand(()).item()]


def _plain(**options: Any) -> list[float]:
    """A plain, unshuffled DataLoader: one value of torch's generator per pass it makes."""
    torch.manual_seed(0)
    return _draws(DataLoader(DATA, batch_size=2, **options))


def _prepared(config: DataLoaderConfiguration, **options: Any) -> list[float]:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    return _draws(accelerator.prepare(DataLoader(DATA, batch_size=2, **options)))


@pytest.mark.parametrize(
    ("config", "options"),
    [
        (DataLoaderConfiguration(), {}),
        (DataLoaderConfiguration(use_seedable_sampler=True, data_seed=5), {}),
        (DataLoaderConfiguration(use_seedable_sampler=True, data_seed=5), {"shuffle": True}),
    ],
    ids=["plain", "seedable", "seedable-shuffled"],
)
def test_a_prepared_loader_takes_one_value_per_pass_as_torch_does(config, options):
    """The seedable sampler shuffles with its own generator (Accelerate's too): the only value
    taken from torch's is the one torch's iterator takes at each pass."""
    assert _prepared(config, **options) == _plain()


def test_with_persistent_workers_a_plain_loader_takes_one_value_and_a_seeded_one_per_pass():
    """Without a seed torch decides (one value, at the first pass); with one, the stream does
    not depend on the workers."""
    workers = {"num_workers": 1, "persistent_workers": True}
    assert _prepared(DataLoaderConfiguration(), **workers) == _plain(**workers) != _plain()
    config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=5)
    assert _prepared(config, **workers) == _plain()


def test_without_a_data_seed_the_seed_is_one_more_value_at_prepare():
    """trainer's deliberate difference (Accelerate takes ``torch.initial_seed()``)."""
    config = DataLoaderConfiguration(use_seedable_sampler=True)
    torch.manual_seed(0)
    torch.randint(0, 2**31 - 1, (1,))
    expected = _draws(DataLoader(DATA, batch_size=2))
    assert _prepared(config, shuffle=True) == expected


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


@pytest.mark.parametrize(
    ("loader", "has_seed"),
    [
        (DataLoader(DATA, batch_size=2), False),
        (DataLoader(DATA, batch_size=2, shuffle=True), True),
        (DataLoader(_Stream(), batch_size=2), True),
    ],
    ids=["unshuffled", "shuffled", "iterable"],
)
def test_on_several_processes_only_loaders_drawn_alike_take_a_seed_at_prepare(loader, has_seed):
    """Accelerate takes a value at prepare for a shuffled loader on several processes, not for an
    unshuffled one; an iterable dataset needs the same seed on every process (each reads the
    whole stream)."""
    torch.manual_seed(0)
    prepared = prepare_loader_shard(
        loader,
        num_processes=2,
        process_index=0,
        world_size=2,
        config=DataLoaderConfiguration(),
        broadcast=lambda tensor: tensor,
    )
    after = torch.rand(()).item()
    torch.manual_seed(0)
    if has_seed:
        torch.randint(0, 2**31 - 1, (1,))
    assert (prepared.seed is not None) is has_seed
    assert after == torch.rand(()).item()


# ---- resuming: the value of a pass is taken once ------------------------------------------------
def _shard(seed: int | None = 3, **options: Any) -> DataLoaderShard:
    """With a seed the pass takes the value itself (its loader draws from the seed's stream);
    without one torch's iterator takes it (the loader reads in order then)."""
    loader = DataLoader(DATA, batch_size=2, shuffle=seed is not None, **options)
    shard = DataLoaderShard(loader)
    shard.seed = seed
    return shard


def _rest(loader: Iterable[Any]) -> list[float]:
    return [torch.rand(()).item() for _ in loader]


@pytest.mark.parametrize("seed", [3, None])
def test_a_state_saved_inside_a_pass_continues_it_without_a_new_value(seed):
    torch.manual_seed(0)
    shard = _shard(seed)
    batches = iter(shard)
    for _ in range(2):
        next(batches)
        torch.rand(())
    state, rng = shard.state_dict(), torch.get_rng_state()
    expected = _rest(batches) + _draws(shard, epochs=1)
    assert state == {"seed": seed, "epoch": 0, "pass_drawn": True, "pass_open": True}

    resumed = _shard(seed)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    received = _rest(skip_first_batches(resumed, 2))
    resumed.set_epoch(1)  # the copy counted epoch 0; the loader itself goes on with epoch 1
    assert received + _draws(resumed, epochs=1) == expected


def test_a_pass_cut_short_is_continued_by_the_loader_itself_not_by_a_copy():
    """The Trainer resumes by setting ``skip_batches`` on the loader: that pass continues the cut
    one. A ``skip_first_batches`` copy is a new loader (as in Accelerate): it takes a value."""
    torch.manual_seed(0)
    shard = _shard()
    for step, _ in enumerate(shard):
        torch.rand(())
        if step == 1:
            break
    state, rng = shard.state_dict(), torch.get_rng_state()
    assert state == {"seed": 3, "epoch": 0, "pass_drawn": True}

    def expected(values: int) -> list[float]:
        torch.set_rng_state(rng)
        for _ in range(values):
            torch.empty((), dtype=torch.int64).random_()
        return [torch.rand(()).item() for _ in range(4)]  # the epoch's 4 batches left

    shard.skip_batches = 2  # in the same process
    assert _rest(shard) == expected(0)
    for is_copy in (False, True):
        resumed = _shard()
        resumed.load_state_dict(state)
        if not is_copy:
            resumed.skip_batches = 2  # the Trainer's way
        torch.set_rng_state(rng)
        drawn = _rest(skip_first_batches(resumed, 2) if is_copy else resumed)
        assert drawn == expected(1 if is_copy else 0)


def test_a_loader_with_persistent_workers_resumes_at_an_epoch_end_exactly():
    torch.manual_seed(0)
    shard = _shard(num_workers=1, persistent_workers=True)
    _rest(shard)
    state, rng = shard.state_dict(), torch.get_rng_state()
    assert state == {"seed": 3, "epoch": 1}  # no pass cut
    expected = _rest(shard)

    resumed = _shard(num_workers=1, persistent_workers=True)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    assert _rest(resumed) == expected


def test_a_state_entry_that_is_not_a_bool_is_refused():
    with pytest.raises(CheckpointError, match="'pass_drawn' must be a bool.*Load a checkpoint"):
        _shard().load_state_dict({"seed": 3, "epoch": 0, "pass_drawn": "yes"})


# ---- two real processes ---------------------------------------------------------------------
@pytest.mark.distributed
def test_on_two_processes_prepared_loaders_take_what_accelerates_take(tmp_path):
    result = torchrun(str(ROOT / "tests/data/draws_job.py"), str(tmp_path), timeout=300)
    assert result.returncode == 0, output_tail(result)
    for rank in range(2):
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8"))
        for name in ("unshuffled", "shuffled", "seedable_data_seed"):
            assert facts[name]["prepared"] == facts[name]["plain"], (rank, name)
        assert facts["resume"]["resumed"] == facts["resume"]["uninterrupted"], rank
