"""Parity by difference: ``WeightAveraging`` and ``EMAWeightAveraging`` on lightning.pytorch 2.6
and trainer.

The default (an equal-weight average after every step), an EMA through ``avg_fn``,
``EMAWeightAveraging`` with a start step and a step interval, and a subclass whose
``should_update`` picks epochs: compared are the validation losses seen during fit (computed on
the average), the final parameters (the average) and the BatchNorm statistics (averaged buffers).
Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.optim.swa_utils import get_ema_avg_fn

from tests.parity.frameworks import BOTH, Framework, loader, quiet, validated

pytest.importorskip("lightning.pytorch")


def _module(framework: Framework, losses: list[float]) -> Any:
    return validated(
        framework.Module,
        lambda: torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)
        ),
        losses,
    )


def _callback(framework: Framework, case: str) -> Any:
    callbacks = framework.callbacks
    if case == "default":
        return callbacks.WeightAveraging()
    if case == "ema avg_fn":
        return callbacks.WeightAveraging(avg_fn=get_ema_avg_fn(0.8), use_buffers=False)
    if case == "EMAWeightAveraging":
        return callbacks.EMAWeightAveraging(
            decay=0.7, update_every_n_steps=2, update_starting_at_step=3
        )

    class EveryEpoch(callbacks.WeightAveraging):  # type: ignore[misc, name-defined]
        def should_update(self, step_idx: Any = None, epoch_idx: Any = None) -> bool:
            return epoch_idx is not None and epoch_idx >= 1

    return EveryEpoch()


@pytest.mark.parametrize(
    "case", ["default", "ema avg_fn", "EMAWeightAveraging", "should_update by epoch"]
)
def test_weight_averaging_as_in_lightning(case: str) -> None:
    seen = {}
    for framework in BOTH:
        losses: list[float] = []
        module = _module(framework, losses)
        run = framework.trainer(
            **quiet(max_epochs=3, num_sanity_val_steps=0, callbacks=[_callback(framework, case)])
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(module, loader(16, batch_size=4), loader(8, seed=1, batch_size=4))
        seen[framework.name] = {
            "val losses": losses,
            "parameters": [p.detach().flatten().tolist() for p in module.parameters()],
            "running_mean": module.net[1].running_mean.tolist(),
        }
    assert seen["trainer"] == seen["lightning"]
