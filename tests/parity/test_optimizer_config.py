"""Parity by difference: what ``configure_optimizers`` may return, on lightning.pytorch 2.6 and
trainer.

An ``lr_scheduler`` dict with Lightning's ``reduce_on_plateau`` field, or with a key neither knows
(``opt_idx``, ``note``: dropped with a warning), trains as in Lightning and
``trainer.lr_scheduler_configs[0].reduce_on_plateau`` reads the same; ``([optimizer], scheduler)``
(the scheduler outside a list) trains with the scheduler; a scheduler built on an optimizer that
was not returned is refused by both (trainer trained at a constant learning rate). Lightning's run
is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import trainer
from tests.parity.frameworks import BOTH, LIGHTNING, TRAINER, Framework, loader, quiet, regression

pl = pytest.importorskip("lightning.pytorch")


def _module(framework: Framework, returns: str, extra: dict[str, Any]) -> Any:
    class Scheduled(regression(framework.Module)):  # type: ignore[misc]
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            if returns == "plateau":
                plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
                scheduler = {"scheduler": plateau, "monitor": "val_loss", **extra}
                return {"optimizer": optimizer, "lr_scheduler": scheduler}
            step_lr = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
            if returns == "bare":
                return [optimizer], step_lr
            if returns == "another":  # a scheduler of an optimizer not returned
                other = torch.optim.SGD(self.parameters(), lr=0.1)
                return [optimizer], [torch.optim.lr_scheduler.StepLR(other, 1)]
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": step_lr, **extra}}

    return Scheduled()


def _fit(framework: Framework, returns: str, extra: dict[str, Any]) -> tuple[Any, ...]:
    run = framework.trainer(**quiet(max_epochs=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.fit(_module(framework, returns, extra), loader(8), loader(4))
    config = run.lr_scheduler_configs[0]
    lr = run.optimizers[0].param_groups[0]["lr"]
    is_warned = any("keys" in str(w.message) and "lr" in str(w.message) for w in caught)
    return run.global_step, round(lr, 6), config.reduce_on_plateau, config.interval, is_warned


@pytest.mark.parametrize(
    ("returns", "extra"),
    [
        ("dict", {}),
        ("dict", {"reduce_on_plateau": False, "interval": "step"}),
        ("dict", {"opt_idx": 0}),
        ("dict", {"note": "warmup", "frequency": 2}),
        ("plateau", {}),
        ("plateau", {"opt_idx": 0, "strict": False}),
        ("bare", {}),
    ],
)
def test_scheduler_configs_as_in_lightning(returns: str, extra: dict[str, Any]) -> None:
    seen = {framework.name: _fit(framework, returns, extra) for framework in BOTH}
    assert seen["trainer"] == seen["lightning"]


def test_a_scheduler_of_another_optimizer_is_refused_as_in_lightning() -> None:
    misconfigured = pl.utilities.exceptions.MisconfigurationException
    with pytest.raises(misconfigured, match="wasn't returned"):
        _fit(LIGHTNING, "another", {})
    with pytest.raises(trainer.HookResultError, match="did not return"):
        _fit(TRAINER, "another", {})
