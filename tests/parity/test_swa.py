"""Parity by difference: StochasticWeightAveraging on lightning.pytorch 2.6 and trainer.

A regression module (with and without BatchNorm, with and without a scheduler that SWALR
replaces, with gradient accumulation) trains on both frameworks with the callback; compared are
every ``training_step``'s epoch, global step and learning rate, every validation loss, the
global step and epoch at the end, the final parameters and the BatchNorm statistics.
Lightning's run is the expected value.

One difference is pinned: with BatchNorm and no validation loader, Lightning's extra BatchNorm
epoch ends with an optimizer step on the gradients of the last SWA step (it skips zero_grad and
backward, and nothing else clears them; its validation's ``on_validation_model_zero_grad``
does, when there is one), so its final weights are not its average. Ours are.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework, loader, quiet

pytestmark = pytest.mark.filterwarnings("ignore")


def _module(base: type, calls: list[Any], *, batch_norm: bool, step_lr: bool) -> Any:
    class Averaged(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            norm = [torch.nn.BatchNorm1d(8)] if batch_norm else []
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 8), *norm, torch.nn.ReLU(), torch.nn.Linear(8, 1)
            )

        def training_step(self, batch, batch_idx):
            run = self.trainer
            lr = run.optimizers[0].param_groups[0]["lr"]
            calls.append(("train", run.current_epoch, run.global_step, round(lr, 7)))
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            calls.append(("val", self.trainer.current_epoch, round(float(loss), 6)))
            self.log("val_loss", loss)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            if not step_lr:
                return optimizer
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": scheduler}

    return Averaged()


def _run(framework: Framework, tmp_path, case: dict[str, Any]) -> dict[str, Any]:
    calls: list[Any] = []
    module = _module(
        framework.Module, calls, batch_norm=case["batch_norm"], step_lr=case.get("step_lr", False)
    )
    swa = framework.callbacks.StochasticWeightAveraging(**case["swa"])
    run = framework.trainer(
        **quiet(
            max_epochs=case.get("max_epochs", 4),
            accumulate_grad_batches=case.get("accumulate", 1),
            default_root_dir=tmp_path / framework.name,
            callbacks=[swa],
        )
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    validation = loader(8, seed=1, batch_size=4) if case.get("validate", True) else None
    run.fit(module, loader(16, batch_size=4), validation)
    return {
        "calls": calls,
        "global_step": run.global_step,
        "epoch": run.current_epoch,
        "max_epochs": run.max_epochs,
        "weights": [p.detach().clone() for p in module.parameters()],
        "buffers": [b.detach().clone().float() for b in module.buffers()],
    }


CASES = {
    "cos, replaces StepLR": {"batch_norm": False, "step_lr": True, "swa": {"swa_lrs": 0.01}},
    "linear, float start": {
        "batch_norm": False,
        "max_epochs": 6,
        "swa": {
            "swa_lrs": 0.02,
            "swa_epoch_start": 0.5,
            "annealing_epochs": 2,
            "annealing_strategy": "linear",
        },
    },
    "BatchNorm epoch": {
        "batch_norm": True,
        "swa": {"swa_lrs": 0.01, "swa_epoch_start": 2, "annealing_epochs": 2},
    },
    "BatchNorm epoch, accumulation, StepLR": {
        "batch_norm": True,
        "step_lr": True,
        "accumulate": 3,
        "max_epochs": 5,
        "swa": {"swa_lrs": 0.01, "swa_epoch_start": 3, "annealing_epochs": 1},
    },
}


@pytest.mark.parametrize("name", list(CASES))
def test_swa_equals_lightnings(tmp_path, name):
    lightning, ours = (_run(framework, tmp_path, CASES[name]) for framework in BOTH)
    assert ours["calls"] == lightning["calls"]
    for key in ("global_step", "epoch", "max_epochs"):
        assert ours[key] == lightning[key], key
    for mine, theirs in zip(
        ours["weights"] + ours["buffers"], lightning["weights"] + lightning["buffers"], strict=True
    ):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_batchnorm_epoch_without_validation_keeps_the_average_where_lightning_steps(tmp_path):
    case = {**CASES["BatchNorm epoch"], "validate": False}
    lightning, ours = (_run(framework, tmp_path, case) for framework in BOTH)
    assert ours["calls"] == lightning["calls"]
    assert ours["global_step"] == lightning["global_step"] == 4 * 4 + 1
    for mine, theirs in zip(ours["buffers"], lightning["buffers"], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)  # computed before the step
    # The weights the BatchNorm epoch started from: the same on both sides (the validated run
    # of the same scenario ends with them on both).
    validated = _run(BOTH[0], tmp_path / "validated", CASES["BatchNorm epoch"])
    for mine, average in zip(ours["weights"], validated["weights"], strict=True):
        torch.testing.assert_close(mine, average, rtol=1e-5, atol=1e-6)
    moved = max(
        float((theirs - average).abs().max())
        for theirs, average in zip(lightning["weights"], validated["weights"], strict=True)
    )
    assert moved > 1e-3  # Lightning's stale-gradient step
