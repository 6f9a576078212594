"""A saved optimizer state is checked against the optimizer before it is loaded."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from tests.faults.test_tampered_checkpoints import rehash
from trainer.checkpoint.optimizer_state import check_optimizer_state
from trainer.errors import CheckpointError


def _stepped(optimizer_class: type, **options: Any) -> torch.optim.Optimizer:
    layer = torch.nn.Linear(4, 3)
    optimizer = optimizer_class(layer.parameters(), **options)
    layer(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return optimizer


@pytest.mark.parametrize(
    ("optimizer_class", "options"),
    [
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
        (torch.optim.AdamW, {"lr": 0.1, "amsgrad": True}),
        (torch.optim.Adafactor, {"lr": 0.1}),  # factored buffers: rows and columns
        (torch.optim.RMSprop, {"lr": 0.1, "centered": True, "foreach": False}),
    ],
)
def test_a_genuine_state_fits(optimizer_class: type, options: dict[str, Any]) -> None:
    optimizer = _stepped(optimizer_class, **options)
    check_optimizer_state(optimizer, optimizer.state_dict(), "ck", 0)


@pytest.mark.parametrize(
    ("optimizer_class", "edit", "field"),
    [
        (torch.optim.SGD, ("lr", "fast"), "param_groups[0].lr is 'fast'"),
        (torch.optim.SGD, ("momentum", math.nan), "param_groups[0].momentum"),
        (torch.optim.SGD, ("nesterov", "yes"), "param_groups[0].nesterov"),
        (torch.optim.AdamW, ("betas", (0.9,)), "param_groups[0].betas"),
        (torch.optim.AdamW, ("eps", [1e-8]), "param_groups[0].eps"),
    ],
)
def test_a_hyperparameter_of_another_kind_is_refused(
    optimizer_class: type, edit: tuple[str, Any], field: str
) -> None:
    optimizer = _stepped(optimizer_class, lr=0.1)
    state = optimizer.state_dict()
    state["param_groups"][0][edit[0]] = edit[1]
    with pytest.raises(
        CheckpointError, match=rf"ck: optimizer_states\[2\]\.{field}".replace("[0]", r"\[0\]")
    ):
        check_optimizer_state(optimizer, state, "ck", 2)


def test_a_buffer_of_another_shape_is_refused() -> None:
    optimizer = _stepped(torch.optim.SGD, lr=0.1, momentum=0.9)
    state = optimizer.state_dict()
    state["state"][0]["momentum_buffer"] = torch.zeros(7)
    with pytest.raises(CheckpointError, match=r"state\[0\]\.momentum_buffer has shape \(7,\)"):
        check_optimizer_state(optimizer, state, "ck", 0)


@pytest.mark.parametrize(
    ("saved_with", "loaded_into", "missing"),
    [
        (torch.optim.SGD, torch.optim.Adam, "['betas', 'eps']"),  # KeyError: 'step' on load before
        (torch.optim.Adam, torch.optim.SGD, "['momentum', 'dampening']"),  # 'momentum' at step
    ],
)
def test_a_state_of_another_optimizer_class_is_refused(
    saved_with: type, loaded_into: type, missing: str
) -> None:
    state = _stepped(saved_with, lr=0.1).state_dict()
    optimizer = _stepped(loaded_into, lr=0.1)
    with pytest.raises(
        CheckpointError,
        match=rf"param_groups\[0\] does not match {loaded_into.__name__}'s: it lacks "
        rf"{loaded_into.__name__}'s hyperparameters {re.escape(missing)}",
    ):
        check_optimizer_state(optimizer, state, "ck", 0)


def test_a_state_saved_before_a_flag_was_added_fits() -> None:
    optimizer = _stepped(torch.optim.Adam, lr=0.1)
    state = optimizer.state_dict()
    for flag in ("decoupled_weight_decay", "fused", "capturable", "differentiable", "foreach"):
        del state["param_groups"][0][flag]  # an older torch did not write them; load adds them
    check_optimizer_state(optimizer, state, "ck", 0)
    optimizer.load_state_dict(state)


def test_fit_resuming_an_sgd_state_into_adam_names_the_mismatch(tmp_path: Path) -> None:
    first = quiet_trainer(tmp_path, max_steps=2)
    first.fit(LinearModule(), make_loader())
    first.save_checkpoint(tmp_path / "sgd")

    class WithAdam(LinearModule):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.1)

    with pytest.raises(CheckpointError, match=r"saved with another optimizer class"):
        quiet_trainer(tmp_path, max_steps=4).fit(
            WithAdam(), make_loader(), ckpt_path=tmp_path / "sgd"
        )


def test_fit_refuses_a_crafted_optimizer_state_before_any_step(tmp_path: Path) -> None:
    first = quiet_trainer(tmp_path, max_steps=2)
    first.fit(LinearModule(), make_loader())
    crafted = tmp_path / "crafted"
    first.save_checkpoint(crafted)
    state = json.loads((crafted / "state.json").read_text())
    state["optimizer_states"][0]["param_groups"][0]["lr"] = "fast"
    (crafted / "state.json").write_text(json.dumps(state))
    rehash(crafted)  # what anyone editing a checkpoint can do
    steps: list[int] = []

    class Recording(LinearModule):
        def training_step(self, batch, batch_idx):
            steps.append(batch_idx)
            return super().training_step(batch, batch_idx)

    again = quiet_trainer(tmp_path, max_steps=4)
    with pytest.raises(CheckpointError, match=r"optimizer_states\[0\]\.param_groups\[0\]\.lr"):
        again.fit(Recording(), make_loader(), ckpt_path=crafted)
    assert steps == []
