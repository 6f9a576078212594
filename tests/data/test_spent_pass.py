"""A loader state taken in a pass's last batch: the loop that iterates again starts the next epoch.

Accelerate's checkpointing example saves every N steps inside the loop, which can land on the
epoch's last batch. Resumed from there, a plain loop over the loader (or over
``skip_first_batches(loader, 0)``) must read the next epoch's order, as the run that went on
did; the Trainer, which resumes that epoch with all its batches skipped, must read nothing and
draw nothing, as before.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator, CheckpointError, skip_first_batches


def _prepared(generator: bool) -> Any:
    dataset = TensorDataset(torch.arange(12))
    options = {"generator": torch.Generator().manual_seed(7)} if generator else {}
    return Accelerator(cpu=True).prepare(DataLoader(dataset, batch_size=3, shuffle=True, **options))


def _order(batches: Any) -> list[list[int]]:
    return [batch[0].tolist() for batch in batches]


def _saved_in_last_batch(generator: bool) -> tuple[dict[str, Any], torch.Tensor, list[Any]]:
    """Epoch 0 with a save in its last batch, then epoch 1: (state, RNG at save, epoch 1)."""
    torch.manual_seed(0)
    loader = _prepared(generator)
    state = rng = None
    for index, _ in enumerate(loader):
        if index == len(loader) - 1:
            state, rng = loader.state_dict(), torch.get_rng_state()
    assert state is not None and rng is not None
    return state, rng, _order(loader)


@pytest.mark.parametrize("generator", [False, True], ids=["global-rng", "own-generator"])
@pytest.mark.parametrize("how", ["loader", "skip-0-copy"])
def test_a_loop_after_loading_reads_the_next_epoch(generator: bool, how: str) -> None:
    state, rng, next_epoch = _saved_in_last_batch(generator)
    torch.manual_seed(123)  # a fresh process: then the saved states are put back
    resumed = _prepared(generator)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    data = resumed if how == "loader" else skip_first_batches(resumed, 0)
    assert _order(data) == next_epoch


def test_the_trainers_resume_of_that_epoch_reads_nothing() -> None:
    """The Trainer's path is as before: that epoch resumed with its batches skipped yields
    nothing (its exact resume from such a checkpoint is
    ``tests/checkpoint/test_resume.py::test_sigkill_after_a_checkpoint_resumes_from_it_exactly``:
    checkpoints every 5 steps of 10-batch epochs, killed at step 13, resumed from step 10)."""
    state, rng, _ = _saved_in_last_batch(generator=False)
    assert state["pass_spent"] is True and "pass_open" not in state
    resumed = _prepared(generator=False)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    resumed.set_epoch(state["epoch"])
    resumed.skip_batches = len(resumed)  # what the Trainer sets: the epoch's batches were done
    assert _order(resumed) == []
    assert resumed.state_dict()["epoch"] == state["epoch"] + 1


@pytest.mark.parametrize(
    ("field", "value"), [("pass_spent", "yes"), ("generator_after", [1, 2, 3])]
)
def test_a_crafted_spent_state_is_refused_when_loaded(field: str, value: Any) -> None:
    """Read from a checkpoint: checked at load, the error naming the field."""
    state, _, _ = _saved_in_last_batch(generator=True)
    assert "generator_after" in state
    state[field] = value
    with pytest.raises(CheckpointError, match=f"field '{field}'"):
        _prepared(generator=True).load_state_dict(state)
