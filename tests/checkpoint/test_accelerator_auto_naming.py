"""Accelerator.save_state with ProjectConfiguration(automatic_checkpoint_naming=True): a second
run in the same project_dir never replaces, prunes or hides the checkpoints it writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainer import Accelerator, ProjectConfiguration
from trainer.errors import CheckpointError


def _run(project_dir: Path, value: float, total_limit: int | None = 3):
    config = ProjectConfiguration(
        project_dir=str(project_dir), automatic_checkpoint_naming=True, total_limit=total_limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model.weight.fill_(value)
    return accelerator, model


def _listing(project_dir: Path) -> list[str]:
    return sorted(os.listdir(project_dir / "checkpoints"))


def test_a_second_run_that_would_not_write_the_newest_checkpoint_is_refused(tmp_path):
    first, _ = _run(tmp_path, 1.0)
    for _ in range(5):
        first.save_state()
    assert _listing(tmp_path) == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]

    second, model = _run(tmp_path, 2.0)  # starts again at iteration 0
    with pytest.raises(CheckpointError, match="checkpoint_4 exists") as error:
        second.save_state()
    assert "would not be the newest" in str(error.value)
    assert "project_configuration.iteration = 5" in str(error.value)
    assert _listing(tmp_path) == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]  # untouched

    second.project_configuration.iteration = 5  # the fix the message gives
    assert second.save_state().endswith("checkpoint_5")
    assert _listing(tmp_path) == ["checkpoint_3", "checkpoint_4", "checkpoint_5"]
    with torch.no_grad():
        model.weight.fill_(0.0)
    assert second.load_state().endswith("checkpoint_5")
    assert model.weight.item() == 2.0  # what was just saved, not the first run's


def test_a_second_run_never_replaces_an_earlier_checkpoint(tmp_path):
    first, _ = _run(tmp_path, 1.0, total_limit=None)
    first.save_state()
    second, model = _run(tmp_path, 2.0, total_limit=None)

    with pytest.raises(CheckpointError, match="checkpoint_0 exists.*would replace it"):
        second.save_state()

    assert second.load_state().endswith("checkpoint_0")  # continue that run instead
    assert model.weight.item() == 1.0 and second.project_configuration.iteration == 1
    assert second.save_state().endswith("checkpoint_1")
    assert _listing(tmp_path) == ["checkpoint_0", "checkpoint_1"]


def test_load_state_numbers_the_next_save_after_the_newest_folder(tmp_path):
    accelerator, _ = _run(tmp_path, 1.0, total_limit=None)
    accelerator.save_state()
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "checkpoint_0").rename(checkpoints / "checkpoint_7")  # saved iteration 0

    assert accelerator.load_state().endswith("checkpoint_7")
    assert accelerator.save_state().endswith("checkpoint_8")


def test_total_limit_prunes_only_checkpoints_trainer_wrote(tmp_path):
    mine = tmp_path / "checkpoints" / "checkpoint_0"  # a user's folder, or one Accelerate wrote
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    accelerator, _ = _run(tmp_path, 1.0, total_limit=1)
    accelerator.project_configuration.iteration = 1

    accelerator.save_state()
    accelerator.save_state()

    assert _listing(tmp_path) == ["checkpoint_0", "checkpoint_2"]
    assert (mine / "notes.txt").read_text() == "mine"


def test_total_limit_keeps_a_checkpoint_a_user_added_files_to(tmp_path):
    accelerator, _ = _run(tmp_path, 1.0, total_limit=1)
    first = accelerator.save_state()
    (Path(first) / "eval.txt").write_text("mine")
    with pytest.warns(UserWarning, match=r"total_limit.*checkpoint_0.*\(eval.txt\): kept"):
        accelerator.save_state()
    accelerator.save_state()  # checkpoint_1 holds nothing of the user's: pruned

    assert _listing(tmp_path) == ["checkpoint_0", "checkpoint_2"]
    assert (Path(first) / "eval.txt").read_text() == "mine"
