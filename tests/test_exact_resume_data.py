"""Exact resume with augmenting data pipelines (issue #20), on one process.

A run stopped at step 13 (checkpoints every 5 steps, ``last`` kept) and resumed with
``fit(ckpt_path="last")`` must see, at every resumed step, the batch the uninterrupted run saw,
bit for bit, and end with equal weights: map-style and iterable datasets drawing from torch,
numpy and ``random``, with 0 or 2 workers, persistent or not, plain DataLoaders and torchdata's
StatefulDataLoader. The 2-process versions are in tests/distributed/test_resume_data.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from tests.data.augment_job import (
    Counter,
    NoisyMap,
    differing_steps,
    differing_weights,
    make_loader,
    run,
)
from trainer import Accelerator, DataLoaderConfiguration
from trainer.checkpoint import read_checkpoint
from trainer.errors import MissingDependencyError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

WORKERS = [(0, False), (2, False), (2, True)]  # (num_workers, persistent_workers)


def _interrupted(tmp_path: Path, make, *, by: str = "should_stop", **options):
    """Stop at step 13, then resume from ``last`` with a fresh loader; return its results."""
    if by == "should_stop":
        run(tmp_path / "resumed", make(), stop_at=13, **options)
    else:  # a first Trainer with max_steps=13, a second one with the larger budget
        run(tmp_path / "resumed", make(), **{**options, "max_steps": 13})
    loader = make()
    seen, weights = run(tmp_path / "resumed", loader, ckpt_path="last", **options)
    return seen, weights, loader


def _assert_exact(full, full_weights, resumed, resumed_weights) -> None:
    assert min(resumed) == 14  # resumed from the checkpoint of step 13
    assert differing_steps(full, resumed) == []  # none differs, none is missing or extra
    assert differing_weights(full_weights, resumed_weights) == []
    assert all(torch.isfinite(w).all() for w in resumed_weights.values())


@pytest.mark.parametrize("kind", ["map", "stream"])
@pytest.mark.parametrize(("workers", "persistent"), WORKERS)
def test_augmenting_data_resumes_exactly(tmp_path, kind, workers, persistent):
    def make():
        return make_loader(kind, num_workers=workers, persistent_workers=persistent)

    full, full_weights = run(tmp_path / "full", make())
    resumed, resumed_weights, _ = _interrupted(tmp_path, make)
    _assert_exact(full, full_weights, resumed, resumed_weights)


def test_a_second_trainer_with_a_larger_max_steps_resumes_exactly(tmp_path):
    def make():
        return make_loader("map", num_workers=2)

    full, full_weights = run(tmp_path / "full", make(), max_steps=25)
    resumed, resumed_weights, _ = _interrupted(tmp_path, make, by="max_steps", max_steps=25)
    _assert_exact(full, full_weights, resumed, resumed_weights)


def test_without_a_seed_the_saved_loader_seed_makes_it_exact(tmp_path):
    torch.manual_seed(1234)  # what a user who seeds nothing has: some state; the loader draws it
    full, full_weights = run(tmp_path / "full", make_loader("map"), seed=None)
    torch.manual_seed(1234)
    run(tmp_path / "resumed", make_loader("map"), seed=None, stop_at=13)
    torch.manual_seed(99)  # a different state on resume: the checkpoint decides
    resumed, resumed_weights = run(
        tmp_path / "resumed", make_loader("map"), seed=None, ckpt_path="last"
    )
    _assert_exact(full, full_weights, resumed, resumed_weights)


def test_the_trajectory_does_not_depend_on_num_workers(tmp_path):
    """Each batch is fetched with generators seeded by its place, and main-process fetches leave
    the training's random streams (dropout) alone: 0, 2 and persistent workers train alike."""
    runs = [
        run(tmp_path / f"w{workers}{persistent}", make_loader("map", num_workers=workers, persistent_workers=persistent))
        for workers, persistent in WORKERS
    ]  # fmt: skip
    (first, first_weights), *others = runs
    for seen, weights in others:
        assert differing_steps(first, seen) == []
        assert differing_weights(first_weights, weights) == []


def test_a_users_worker_init_fn_still_runs_and_reaches_the_dataset(tmp_path):
    calls = Counter()

    def worker_init_fn(worker_id: int) -> None:
        calls.add()
        info = torch.utils.data.get_worker_info()
        info.dataset.scale = 2.0  # PyTorch's idiom: configure the worker's copy of the dataset

    class Scaled(NoisyMap):
        scale = 1.0

        def __getitem__(self, index):
            x, y = super().__getitem__(index)
            return x * self.scale, y * self.scale

    def make():
        return DataLoader(
            Scaled(), batch_size=4, shuffle=True, num_workers=2, worker_init_fn=worker_init_fn
        )

    full, full_weights = run(tmp_path / "full", make(), max_epochs=2)
    assert calls.value == 2 * 2  # two workers in each of the two epochs
    plain = make_loader("map", num_workers=2)
    unscaled, _ = run(tmp_path / "plain", plain, max_epochs=1)
    assert torch.equal(full[1], unscaled[1] * 2.0)  # the attribute reached the user's dataset
    resumed, resumed_weights, _ = _interrupted(tmp_path, make, max_epochs=2)
    _assert_exact(full, full_weights, resumed, resumed_weights)


# ---- torchdata's StatefulDataLoader -----------------------------------------------------------


@pytest.mark.parametrize(("kind", "workers", "persistent"), [
    ("map", 0, False), ("map", 2, True),
    ("resumable", 0, False), ("resumable", 2, False), ("resumable", 2, True),
])  # fmt: skip
def test_a_stateful_dataloader_resumes_exactly_without_reading_again(
    tmp_path, kind, workers, persistent
):
    pytest.importorskip("torchdata")

    def make():
        return make_loader(kind, num_workers=workers, persistent_workers=persistent, stateful=True)

    full, full_weights = run(tmp_path / "full", make())
    resumed, resumed_weights, loader = _interrupted(tmp_path, make)
    _assert_exact(full, full_weights, resumed, resumed_weights)
    consumed = sum(len(x) for x in resumed.values())
    assert loader.dataset.produced.value == consumed  # nothing before step 13 read again
    state = read_checkpoint(tmp_path / "resumed" / "checkpoints" / "last")  # the end of fit
    assert state["loops"]["train_loader"]["loader"]["_iterator_finished"] is True


def test_a_plain_loader_replays_an_iterable_stream_to_the_resume_point(tmp_path):
    """The contrast: without a StatefulDataLoader (or a stateful dataset) a stream is read again
    from the start of the epoch, though exactly, since its draws are seeded per epoch."""
    full, full_weights = run(tmp_path / "full", make_loader("resumable"))
    resumed, resumed_weights, loader = _interrupted(tmp_path, lambda: make_loader("resumable"))
    _assert_exact(full, full_weights, resumed, resumed_weights)
    assert loader.dataset.produced.value > sum(len(x) for x in resumed.values())


def test_accelerator_makes_loaders_stateful_and_carries_their_position(tmp_path):
    pytest.importorskip("torchdata")
    config = DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True)

    def prepared():
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        loader = DataLoader(NoisyMap(), batch_size=4, shuffle=True, num_workers=2)
        model, loader = accelerator.prepare(model, loader)
        return accelerator, loader

    accelerator, loader = prepared()
    assert type(loader.base_dataloader).__name__ == "StatefulDataLoader"
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    accelerator.save_state(tmp_path / "state")
    rest = [x for x, _ in batches]

    accelerator, loader = prepared()
    accelerator.load_state(tmp_path / "state")
    again = [x for x, _ in loader]
    assert len(again) == len(rest) == 7
    assert all(torch.equal(a, b) for a, b in zip(again, rest, strict=True))
    assert loader.dataset.produced.value == 7 * 4  # the first 3 batches were not read again


def test_use_stateful_dataloader_without_torchdata_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)  # import fails
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    with pytest.raises(MissingDependencyError, match=r"trainer\[stateful\]"):
        Accelerator(cpu=True, dataloader_config=config).prepare(DataLoader(range(8)))


def test_import_trainer_does_not_import_torchdata():
    code = "import sys, trainer, trainer.data; print('torchdata' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
