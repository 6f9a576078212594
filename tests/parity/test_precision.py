"""Parity by difference: precision modes on the CPU, on lightning.pytorch 2.6 and trainer.

One scenario per mode: a step that builds a tensor of its own and adds it to the activations (under
a true precision Lightning makes it the mode's dtype), a spike in the loss, and ``self.log`` of
values of every kind (bfloat16, float16, integer and float32 tensors, a Python number) on step and
epoch, in training and validation. What both did is compared exactly: the losses the steps saw,
the final parameters, and every ``callback_metrics`` value with its dtype. Lightning's run is the
expected value.

``"16-mixed"`` on the CPU is the one documented difference: Lightning replaces it by
``"bf16-mixed"``; trainer runs float16 autocast with a CPU ``GradScaler``, which matches
Lightning's own float16 plugin given explicitly.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, LIGHTNING, TRAINER, Framework, loader, quiet

SPIKE_BATCH = 3  # its loss is multiplied by 1e6: under 16-mixed the scaler skips that step


def _module(framework: Framework) -> Any:
    class Scenario(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.hidden = torch.nn.Linear(4, 8)
            self.out = torch.nn.Linear(8, 1)
            self.losses: list[tuple[str, float]] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden = torch.tanh(self.hidden(x))
            hidden = hidden + torch.full((8,), 0.01)  # a tensor the step builds itself
            return self.out(hidden)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            out = self(x)
            loss = torch.nn.functional.mse_loss(out.float(), y.float())
            if batch_idx == SPIKE_BATCH:
                loss = loss * 1e6
            self.losses.append((str(out.dtype), round(loss.item(), 6)))
            self.log("loss", loss, on_epoch=True)
            self.log(
                "bf16", torch.tensor(1.0 + 0.01 * batch_idx, dtype=torch.bfloat16), on_epoch=True
            )
            self.log(
                "fp16", torch.tensor(1.0 + 0.001 * batch_idx, dtype=torch.float16), on_epoch=True
            )
            self.log("index", torch.tensor(batch_idx), on_epoch=True, reduce_fx="sum")
            self.log("python", 1.0 + 1e-9 * batch_idx, on_epoch=True)
            self.log("big", torch.tensor(1e5 + 0.01 * batch_idx), on_epoch=True, reduce_fx="sum")
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x).float(), y.float()))
            self.log("val_python", 1.0 + 1e-9 * batch_idx)
            self.log("val_bf16", torch.tensor(1.0 + 0.01 * batch_idx, dtype=torch.bfloat16))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    return Scenario()


def _run(framework: Framework, **options: Any) -> dict[str, Any]:
    module = _module(framework)
    fit = framework.trainer(**quiet(max_epochs=2, limit_val_batches=3, **options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit.fit(module, loader(24, batch_size=4), loader(12, seed=1, batch_size=4))
    return {
        "losses": module.losses,
        "params": {n: p.detach().double() for n, p in module.named_parameters()},
        "param_dtype": {str(p.dtype) for p in module.parameters()},
        "metrics": {k: (str(v.dtype), v.item()) for k, v in sorted(fit.callback_metrics.items())},
        "global_step": fit.global_step,
    }


def _assert_same(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    assert actual["losses"] == expected["losses"]
    assert actual["param_dtype"] == expected["param_dtype"]
    assert actual["global_step"] == expected["global_step"]
    for name, value in expected["params"].items():
        assert torch.equal(actual["params"][name], value), name
    assert actual["metrics"] == expected["metrics"]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "64-true"])
def test_precision_modes_match_lightning(precision: str) -> None:
    expected, actual = (_run(framework, precision=precision) for framework in BOTH)
    assert expected["metrics"]["bf16_epoch"][0] in ("torch.float32", "torch.float64")
    _assert_same(expected, actual)


def test_16_mixed_matches_lightnings_float16_plugin_on_the_cpu() -> None:
    from lightning.pytorch.plugins import MixedPrecision

    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    expected = _run(LIGHTNING, plugins=[plugin])
    actual = _run(TRAINER, precision="16-mixed")
    assert {dtype for dtype, _ in actual["losses"]} == {"torch.float16"}
    _assert_same(expected, actual)


def test_16_mixed_on_the_cpu_is_float16_here_and_bfloat16_in_lightning() -> None:
    # The documented difference (docs/migration/lightning.md): Lightning 2.6 replaces "16-mixed"
    # by "bf16-mixed" on the CPU, with a warning; trainer keeps float16 and its GradScaler.
    with pytest.warns(UserWarning, match="bf16-mixed"):
        lightning = LIGHTNING.trainer(**quiet(precision="16-mixed"))
    assert lightning.precision_plugin.precision == "bf16-mixed"
    ours = TRAINER.trainer(**quiet(precision="16-mixed"))
    assert ours.precision_plugin.name == "16-mixed"
