"""Parity by difference: GradientAccumulationScheduler on lightning.pytorch 2.6 and trainer.

A module with BatchNorm and SGD with momentum trains six epochs on both frameworks while the
callback changes ``accumulate_grad_batches`` between epochs (alone, and with an epoch-interval
StepLR); every validation loss, the global step, the final learning rate, the BatchNorm
statistics, ``callback_metrics`` and the final weights must agree.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework, loader, quiet

pytestmark = pytest.mark.filterwarnings("ignore")


def _module(base: type, with_scheduler: bool) -> Any:
    class Accumulating(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 8),
                torch.nn.BatchNorm1d(8),
                torch.nn.ReLU(),
                torch.nn.Linear(8, 1),
            )
            self.val_losses: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.val_losses.append(round(float(loss), 6))
            self.log("val_loss", loss)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            if not with_scheduler:
                return optimizer
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": scheduler}

    return Accumulating()


def _run(framework: Framework, tmp_path, scheduling: dict[int, int], with_scheduler: bool) -> dict:
    module = _module(framework.Module, with_scheduler)
    callback = framework.callbacks.GradientAccumulationScheduler(scheduling=scheduling)
    run = framework.trainer(
        **quiet(max_epochs=6, default_root_dir=tmp_path / framework.name, callbacks=[callback])
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    run.fit(module, loader(40, batch_size=4), loader(12, seed=1, batch_size=4))
    return {
        "val_losses": module.val_losses,
        "global_step": run.global_step,
        "lr": [group["lr"] for group in run.optimizers[0].param_groups],
        "running_mean": module.net[1].running_mean.clone(),
        "metrics": {k: round(float(v), 5) for k, v in sorted(run.callback_metrics.items())},
        "weights": [p.detach().clone() for p in module.parameters()],
    }


@pytest.mark.parametrize(
    ("scheduling", "with_scheduler"),
    [({0: 1, 2: 3, 4: 2}, False), ({1: 2}, True)],
    ids=["1-then-3-then-2", "2-from-epoch-1-with-StepLR"],
)
def test_training_under_a_changing_accumulation_equals_lightnings(
    tmp_path, scheduling, with_scheduler
):
    lightning, ours = (_run(fw, tmp_path, scheduling, with_scheduler) for fw in BOTH)
    assert ours["val_losses"] == pytest.approx(lightning["val_losses"], abs=1e-5)
    assert ours["global_step"] == lightning["global_step"]
    assert ours["lr"] == pytest.approx(lightning["lr"])
    assert ours["metrics"] == pytest.approx(lightning["metrics"], abs=1e-5)
    torch.testing.assert_close(ours["running_mean"], lightning["running_mean"])
    for mine, theirs in zip(ours["weights"], lightning["weights"]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
