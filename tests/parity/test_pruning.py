"""Parity by difference: ``ModelPruning`` on lightning.pytorch 2.6 and trainer.

A small MLP trained 3 epochs with pruning at each training epoch's end (or validation epoch's):
global L1 with the lottery-ticket reset (the defaults), per-parameter L1 with an amount that
grows with the epoch, structured Ln along a dimension, chosen parameters, a class as
``pruning_fn``, masks kept (``make_pruning_permanent=False``). Compared: the final parameters and
buffers (masks included), the validation losses, and the weights a checkpoint holds. Lightning's
run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.nn.utils import prune

from tests.parity.frameworks import BOTH, Framework, loader, quiet, validated

pytest.importorskip("lightning.pytorch")


def _module(framework: Framework, losses: list[float]) -> Any:
    return validated(
        framework.Module,
        lambda: torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        ),
        losses,
    )


CASES: dict[str, Any] = {
    "defaults (global L1, lottery ticket)": lambda m: {"pruning_fn": "l1_unstructured"},
    "local L1, amount by epoch, no lottery": lambda m: {
        "pruning_fn": "l1_unstructured",
        "use_global_unstructured": False,
        "amount": lambda epoch: 0.1 * (epoch + 1),
        "use_lottery_ticket_hypothesis": False,
    },
    "structured Ln along dim 0, at validation end": lambda m: {
        "pruning_fn": "ln_structured",
        "parameter_names": ["weight"],  # a bias has one dimension: nothing to cut along
        "use_global_unstructured": False,
        "pruning_dim": 0,
        "pruning_norm": 2,
        "amount": 0.25,
        "prune_on_train_epoch_end": False,
        "use_lottery_ticket_hypothesis": False,
    },
    "chosen parameter, a class, masks kept": lambda m: {
        "pruning_fn": prune.L1Unstructured,
        "parameters_to_prune": [(m.net[0], "weight")],
        "amount": 3,
        "make_pruning_permanent": False,
        "apply_pruning": lambda epoch: epoch != 1,
    },
    "weights and biases by name": lambda m: {
        "pruning_fn": "l1_unstructured",
        "parameter_names": ["weight", "bias"],
        "amount": 0.4,
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_model_pruning_as_in_lightning(tmp_path, case: str) -> None:
    seen = {}
    for framework in BOTH:
        losses: list[float] = []
        module = _module(framework, losses)
        pruning = framework.callbacks.ModelPruning(**CASES[case](module))
        run = framework.trainer(**quiet(max_epochs=3, num_sanity_val_steps=0, callbacks=[pruning]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(module, loader(16, batch_size=4), loader(8, seed=1, batch_size=4))
            run.save_checkpoint(str(tmp_path / f"{framework.name}.ckpt"))
        saved = (
            torch.load(tmp_path / "lightning.ckpt", weights_only=True)["state_dict"]
            if framework.name == "lightning"
            else __import__("trainer").checkpoint.read_checkpoint(tmp_path / "trainer.ckpt")[
                "state_dict"
            ]
        )
        seen[framework.name] = {
            "state": {k: v.flatten().tolist() for k, v in sorted(module.state_dict().items())},
            "val losses": losses,
            "checkpoint": {k: v.flatten().tolist() for k, v in sorted(saved.items())},
        }
    assert seen["trainer"] == seen["lightning"]
    zeros = sum(v.count(0.0) for v in seen["trainer"]["checkpoint"].values())
    assert zeros > 0  # something was pruned
