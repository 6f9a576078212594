"""Parity by difference: the fit loop's edge cases, on lightning.pytorch 2.6 and trainer.

``training_step`` returning None on the batch that ends an accumulation window; an epoch skipped
(``on_train_batch_start`` -> -1) inside a window; ``should_stop`` set in
``on_train_epoch_start``; ``max_time`` against ``min_epochs`` / ``min_steps``; a sanity check of
every batch (``num_sanity_val_steps=-1``) under ``limit_val_batches``; fits with nothing to
train; what ``on_train_batch_end`` and ``on_before_backward`` receive. Each scenario records the
hooks (with epoch and step) and the weights on both frameworks; Lightning's run is the expected
value.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, recording_callback
from tests.parity.frameworks import regression as regression_class

_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
)


def _weights(module: Any) -> list[float]:
    return [round(v, 5) for v in module.net.weight.detach().flatten().tolist()]


# ---- training_step returning None on a window's stepping batch ------------------------------
def _none_on_stepping_batch(fw: Any, recipe: str) -> dict[str, Any]:
    calls: list[Any] = []

    class NoneAtOne(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            return None if batch_idx in (1, 4) else self.loss(batch)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            calls.append(("weights", batch_idx, self.global_step, _weights(self)))

        if recipe == "optimizer_step":

            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
                calls.append(("m:optimizer_step", batch_idx))
                optimizer.step(closure=optimizer_closure)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callbacks = [] if recipe == "plain" else [recording_callback(fw.Callback, calls, _BATCH_HOOKS)]
    clip = {"gradient_clip_val": 0.05} if recipe == "clipping" else {}
    fit = fw.trainer(callbacks=callbacks, **quiet(max_epochs=1, accumulate_grad_batches=2, **clip))
    module = NoneAtOne()
    fit.fit(module, loader(12))
    return {"calls": calls, "global_step": fit.global_step, "weights": _weights(module)}


@pytest.mark.parametrize("recipe", ["plain", "hooks", "clipping", "optimizer_step"])
def test_none_on_a_stepping_batch_steps_on_the_accumulated_gradients(recipe: str) -> None:
    """Batch 1 ends the first window: Lightning still steps (and clips) with batch 0's
    gradients; batch 4 starts a window, whose step takes batch 5's alone."""
    assert _none_on_stepping_batch(TRAINER, recipe) == _none_on_stepping_batch(LIGHTNING, recipe)
