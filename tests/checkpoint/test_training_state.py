"""The core a Trainer checkpoint and an Accelerator's save_state share (trainer.checkpoint.training_state)."""

from __future__ import annotations

import pytest
import torch

import trainer
from tests.conftest import make_loader
from trainer import Accelerator
from trainer.checkpoint import read_checkpoint
from trainer.checkpoint.training_state import load_states, rng_state_for_rank

CORE = {"optimizer_states", "lr_schedulers", "precision", "rng_states", "state_dict"}


class Regressor(trainer.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)]


def test_trainer_and_accelerator_checkpoints_hold_the_same_core(tmp_path):
    torch.manual_seed(0)
    fit = trainer.Trainer(
        max_steps=2, default_root_dir=tmp_path / "t", logger=False, enable_progress_bar=False
    )
    fit.fit(Regressor(), make_loader(n=8))
    fit.save_checkpoint(tmp_path / "trainer_ckpt")
    from_trainer = read_checkpoint(tmp_path / "trainer_ckpt")

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    accelerator.prepare(model, optimizer, make_loader(n=8), scheduler)
    accelerator.save_state(tmp_path / "accelerator_state")
    from_accelerator = read_checkpoint(tmp_path / "accelerator_state")

    assert CORE <= from_trainer.keys() and CORE | {"dataloaders"} <= from_accelerator.keys()
    for key in ("optimizer_states", "lr_schedulers"):
        assert len(from_trainer[key]) == len(from_accelerator[key]) == 1
    assert (
        from_trainer["optimizer_states"][0].keys() == from_accelerator["optimizer_states"][0].keys()
    )
    assert from_trainer["precision"] == from_accelerator["precision"]
    # the loader's state sits where each format always kept it
    assert "dataloaders" not in from_trainer and from_trainer["loops"]["train_loader"] is not None
    assert len(from_trainer["rng_states"]) == len(from_accelerator["rng_states"]) == 1


def test_load_state_with_an_optimizer_state_that_does_not_fit_names_the_checkpoint(tmp_path):
    """Before the shared loader, the Accelerator let torch's ValueError through."""
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.save_state(tmp_path / "s")
    other = Accelerator(cpu=True)
    same = torch.nn.Linear(2, 2)
    groups = [{"params": [same.weight]}, {"params": [same.bias]}]  # two groups, saved: one
    other.prepare(same, torch.optim.SGD(groups, lr=0.1))
    with pytest.raises(
        trainer.CheckpointError, match=r"load_state\(.*s\).*optimizer_states do not fit SGD"
    ):
        other.load_state(tmp_path / "s")


def test_load_state_with_weights_that_do_not_fit_names_the_checkpoint(tmp_path):
    """Before the shared loader, the Accelerator let torch's RuntimeError through."""
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.save_state(tmp_path / "s")
    other = Accelerator(cpu=True)
    other.prepare(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(trainer.CheckpointError, match=r"weights do not fit Sequential"):
        other.load_state(tmp_path / "s")


def test_load_states_checks_counts_before_loading_anything():
    first, second = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    before = first.weight.detach().clone()
    with pytest.raises(trainer.CheckpointError, match="here: the checkpoint has 1 models but 2"):
        load_states("models", [first, second], [{"weight": torch.zeros(1, 1)}], "here", "Fix.")
    assert torch.equal(first.weight, before)


def test_rng_state_for_rank_takes_the_last_saved_process_past_them():
    assert rng_state_for_rank([], 0) is None and rng_state_for_rank(None, 3) is None
    assert rng_state_for_rank(["a", "b"], 1) == "b" and rng_state_for_rank(["a", "b"], 5) == "b"
