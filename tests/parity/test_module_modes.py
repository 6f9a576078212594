"""Parity by difference: train / eval modes on lightning.pytorch 2.6 and trainer.

Lightning never calls ``train()`` during training: a BatchNorm the user froze with ``.eval()``
keeps its statistics, and a module in eval mode at the start of ``fit`` gets a warning and stays
so. An evaluation records each submodule's mode and restores it afterwards, through the
``on_<stage>_model_eval`` / ``on_<stage>_model_train`` hooks a module may override (MC dropout at
validation). Compared: the modes every step saw, BatchNorm statistics, predictions, final
parameters, warnings. Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework, loader, quiet

pytest.importorskip("lightning.pytorch")


def _module(framework: Framework, seen: list[Any], *, mc_dropout: bool = False) -> Any:
    class Frozen(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
            self.dropout = torch.nn.Dropout(0.5)
            self.head = torch.nn.Linear(8, 1)
            self.draws = 0

        def _modes(self) -> tuple[bool, ...]:
            return (self.training, self.body[1].training, self.dropout.training)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # dropout's mask drawn from a stream of its own: the frameworks' loaders draw
            # from the global one differently
            self.draws += 1
            torch.manual_seed(1000 + self.draws)
            return self.head(self.dropout(self.body(x)))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(("train", *self._modes()))
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            seen.append(("validation", *self._modes()))
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(("predict", *self._modes()))
            return self(batch[0])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

        if mc_dropout:

            def on_validation_model_eval(self) -> None:
                super().on_validation_model_eval()
                self.dropout.train()  # Monte Carlo dropout while validating

            def on_validation_model_train(self) -> None:
                seen.append("on_validation_model_train")
                self.train()

    return Frozen()


def _run(framework: Framework, prepare: str, *, mc_dropout: bool = False) -> dict[str, Any]:
    seen: list[Any] = []
    module = _module(framework, seen, mc_dropout=mc_dropout)
    if prepare == "frozen batchnorm":
        module.body[1].eval()
    elif prepare == "all eval":
        module.eval()
    run = framework.trainer(**quiet(max_epochs=2, num_sanity_val_steps=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.validate(module, loader(4, seed=2, batch_size=4), **framework.eval_options)
        run.fit(module, loader(8, batch_size=4), loader(4, seed=1, batch_size=4))
        predictions = run.predict(module, loader(4, seed=3, batch_size=4))
    return {
        "seen": seen,
        "modes after": [sub.training for sub in module.modules()],
        "running_mean": module.body[1].running_mean.tolist(),
        "predictions": [p.flatten().tolist() for p in predictions],
        "parameters": [p.detach().flatten().tolist() for p in module.parameters()],
        "warned eval": any(
            "in eval mode at the start of training" in str(w.message) for w in caught
        ),
    }


@pytest.mark.parametrize("prepare", ["as built", "frozen batchnorm", "all eval"])
def test_modes_as_in_lightning(prepare: str) -> None:
    seen = {framework.name: _run(framework, prepare) for framework in BOTH}
    assert seen["trainer"] == seen["lightning"]
    if prepare == "frozen batchnorm":  # its statistics never moved
        assert seen["trainer"]["running_mean"] == [0.0] * 8
        assert all(step[2] is False for step in seen["trainer"]["seen"])
    assert seen["trainer"]["warned eval"] is (prepare != "as built")


def test_mode_hooks_overridden_as_in_lightning() -> None:
    seen = {framework.name: _run(framework, "as built", mc_dropout=True) for framework in BOTH}
    assert seen["trainer"] == seen["lightning"]
    validations = [s for s in seen["trainer"]["seen"] if s[0] == "validation"]
    assert validations and all(s[1:] == (False, False, True) for s in validations)
