"""Parity by difference: Lightning's call forms that ported code uses, on lightning.pytorch 2.6
and trainer.

``trainer.fit(model=..., ...)`` / ``validate(model=...)`` / ``test(model=...)`` /
``predict(model=..., return_predictions=False)`` and ``weights_only=`` on a resume;
``self.log(..., rank_zero_only=True, metric_attribute=...)``; and
``self.optimizers(use_pl_optimizer=False)`` in manual optimization. Compared: what each call
returns, the metrics, the predictions and the final weights. Lightning's run is the expected
value.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework, loader, quiet

pytestmark = pytest.mark.filterwarnings("ignore")


def _module(framework: Framework, *, manual: bool = False) -> Any:
    class Ported(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)
            self.automatic_optimization = not manual
            self.optimizer_types: list[str] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, rank_zero_only=True, sync_dist=True)
            if not manual:
                return loss
            optimizer = self.optimizers(use_pl_optimizer=False)
            self.optimizer_types.append(type(optimizer).__name__)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            return None

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("val_loss", loss, metric_attribute=None)

        def test_step(self, batch, batch_idx):
            self.validation_step(batch, batch_idx)

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Ported()


def _calls(framework: Framework, tmp_path, *, manual: bool) -> dict[str, Any]:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    module = _module(framework, manual=manual)
    root = tmp_path / framework.name
    run = framework.trainer(**quiet(max_epochs=2, default_root_dir=root))
    run.fit(model=module, train_dataloaders=loader(16, batch_size=4), val_dataloaders=loader(8))
    path = root / "model.ckpt"
    run.save_checkpoint(path)
    resumed_module = _module(framework, manual=manual)
    resumed = framework.trainer(**quiet(max_epochs=3, default_root_dir=root))
    resumed.fit(
        model=resumed_module,
        train_dataloaders=loader(16, batch_size=4),
        ckpt_path=path,
        weights_only=True,
    )
    options = framework.eval_options
    return {
        "metrics": {k: round(float(v), 6) for k, v in run.callback_metrics.items()},
        "validate": run.validate(model=module, dataloaders=loader(8), **options),
        "test": run.test(model=module, dataloaders=loader(8, seed=2), **options),
        "predict": run.predict(model=module, dataloaders=loader(4)),
        "predict_none": run.predict(model=module, dataloaders=loader(4), return_predictions=False),
        "resumed_step": resumed.global_step,
        "weights": [p.detach().clone() for p in resumed_module.parameters()],
        "optimizer_types": sorted(set(module.optimizer_types)),
    }


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_lightning_call_forms_do_what_lightning_does(tmp_path, manual):
    lightning, ours = (_calls(framework, tmp_path, manual=manual) for framework in BOTH)
    assert ours["predict_none"] is None and lightning["predict_none"] is None
    for key in ("metrics", "resumed_step", "optimizer_types"):
        assert ours[key] == pytest.approx(lightning[key]), key
    for key in ("validate", "test"):  # one dict per dataloader (pytest 9.2's approx takes no
        assert len(ours[key]) == len(lightning[key]), key  # list of dicts whole)
        for mine, theirs in zip(ours[key], lightning[key], strict=True):
            assert mine == pytest.approx(theirs), key
    for mine, theirs in zip(ours["predict"], lightning["predict"], strict=True):
        torch.testing.assert_close(mine, theirs)
    for mine, theirs in zip(ours["weights"], lightning["weights"], strict=True):
        torch.testing.assert_close(mine, theirs)
    assert ours["optimizer_types"] == (["SGD"] if manual else [])
