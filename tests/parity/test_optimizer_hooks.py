"""Parity by difference: the module's ``optimizer_step`` / ``optimizer_zero_grad`` hooks under
automatic optimization, on lightning.pytorch 2.6 and on trainer.

A module that overrides ``optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)`` —
a learning-rate warm-up before ``optimizer.step(closure=optimizer_closure)``, a step taken only
every other batch, LBFGS — or ``optimizer_zero_grad(epoch, batch_idx, optimizer)`` gets
Lightning's calls: when each runs among the batch hooks (with epoch, step and batch index), what
``training_step`` sees, what ``optimizer.step`` returns, and the weights at the end. Lightning's
run is the expected value.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import trainer
from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, recording_callback
from tests.parity.frameworks import regression as regression_class

_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
    "on_validation_start",
)


def _module(fw: Any, calls: list[Any], recipe: str) -> Any:
    class Hooked(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            calls.append(("m:training_step", batch_idx, round(lr, 6)))
            if recipe == "returns None" and batch_idx == 2:
                return None
            return self.loss(batch)

        def configure_optimizers(self):
            if recipe == "LBFGS":
                return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)

        if recipe != "zero_grad only":

            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
                is_theirs = optimizer is self.optimizers()
                calls.append(("m:optimizer_step", epoch, batch_idx, self.global_step, is_theirs))
                if recipe == "every other step" and batch_idx % 4 == 1:
                    optimizer_closure()  # trains on the batch, does not step
                    return
                if recipe == "closure never called":
                    return
                for group in optimizer.param_groups:  # warm-up: lr grows with the steps
                    group["lr"] = 0.1 * min(1.0, (self.trainer.global_step + 1) / 4)
                returned = optimizer.step(closure=optimizer_closure)
                value = None if returned is None else round(float(returned), 5)
                calls.append(("m:step returned", value))

        if recipe in ("zero_grad", "zero_grad only"):

            def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
                is_torch = isinstance(optimizer, torch.optim.SGD)
                calls.append(("m:optimizer_zero_grad", epoch, batch_idx, is_torch))
                optimizer.zero_grad(set_to_none=False)

    return Hooked()


def _run(fw: Any, recipe: str, **options: Any) -> tuple[list[Any], dict[str, Any]]:
    calls: list[Any] = []
    recorder = recording_callback(fw.Callback, calls, _BATCH_HOOKS)
    options = quiet(max_epochs=2, num_sanity_val_steps=0, gradient_clip_val=0.5, **options)
    fit = fw.trainer(callbacks=[recorder], **options)
    module = _module(fw, calls, recipe)
    fit.fit(module, loader(8), loader(4, seed=1))
    facts = {
        "global_step": fit.global_step,
        "weight": [round(v, 5) for v in module.net.weight.detach().flatten().tolist()],
        "lr": round(fit.optimizers[0].param_groups[0]["lr"], 8),
    }
    return calls, facts


@pytest.mark.parametrize(
    ("recipe", "options"),
    [
        ("warm-up", {}),
        ("warm-up", {"accumulate_grad_batches": 3, "val_check_interval": 2}),
        ("every other step", {}),
        ("returns None", {}),
        ("zero_grad", {"accumulate_grad_batches": 2}),
        ("zero_grad only", {}),
        ("LBFGS", {}),
    ],
    ids=[
        "warm-up",
        "warm-up, accumulation, validation mid-window",
        "every other step",
        "training_step returns None",
        "optimizer_zero_grad, accumulation",
        "optimizer_zero_grad alone",
        "LBFGS",
    ],
)
def test_optimizer_hooks_run_as_in_lightning(recipe: str, options: dict[str, Any]) -> None:
    expected = _run(LIGHTNING, recipe, **options)
    assert any(str(call[0]).startswith("m:optimizer_") for call in expected[0])
    assert _run(TRAINER, recipe, **options) == expected


def test_a_hook_that_never_runs_the_closure_is_an_error() -> None:
    with pytest.raises(Exception, match="closure hasn't been executed"):
        _run(LIGHTNING, "closure never called")
    with pytest.raises(trainer.ConfigurationError, match="without running optimizer_closure"):
        _run(TRAINER, "closure never called")
