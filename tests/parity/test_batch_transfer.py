"""Parity by difference: the batch-transfer hooks (``on_before_batch_transfer``,
``transfer_batch_to_device``, ``on_after_batch_transfer``) on lightning.pytorch 2.6 and trainer.

A module that changes its batches in the hooks (a custom batch class turned into tensors by
``transfer_batch_to_device``, scaled before the move, shifted after it) is fitted with
validation and the sanity check, then validated on two loaders, tested and used to predict.
Compared: every hook call in order with its ``dataloader_idx``, what the batch was at each point,
the running stage, the losses, the predictions and the final parameters; a DataModule that
overrides a hook wins over the module, as in Lightning. Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import trainer
from tests.parity.frameworks import BOTH, LIGHTNING, Framework, dataset, quiet

pl = pytest.importorskip("lightning.pytorch")


@dataclass
class Pair:
    """A batch type no framework knows how to move: ``transfer_batch_to_device`` must."""

    x: torch.Tensor
    y: torch.Tensor


def _pairs(n: int, seed: int = 0) -> DataLoader:
    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> Pair:
        return Pair(torch.stack([x for x, _ in items]), torch.stack([y for _, y in items]))

    return DataLoader(dataset(n, seed), batch_size=4, collate_fn=collate)


def _stage(module: Any) -> str:
    run = module.trainer
    names = ("sanity_checking", "training", "validating", "testing", "predicting")
    return next((name for name in names if getattr(run, name)), "none")


def _module(framework: Framework, calls: list[Any]) -> Any:
    class Shifted(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            calls.append(("before", _stage(self), dataloader_idx, type(batch).__name__))
            return Pair(batch.x * 2, batch.y)

        def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
            calls.append(("transfer", _stage(self), dataloader_idx, torch.device(device).type))
            return super().transfer_batch_to_device((batch.x, batch.y), device, dataloader_idx)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            calls.append(("after", _stage(self), dataloader_idx, type(batch).__name__))
            x, y = batch
            return x + 1, y

        def _loss(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            calls.append(("train_batch_start", batch_idx, round(float(batch[0].sum()), 4)))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self._loss(batch)
            calls.append(("loss", round(float(loss), 5)))
            return loss

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            calls.append(("validation_step", batch_idx, dataloader_idx))
            self.log("val_loss", self._loss(batch))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", self._loss(batch))

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Shifted()


def _run(framework: Framework) -> dict[str, Any]:
    calls: list[Any] = []
    module = _module(framework, calls)
    run = framework.trainer(**quiet(max_epochs=2, num_sanity_val_steps=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(module, _pairs(12), _pairs(8, seed=1))
        calls.append("validate")
        run.validate(module, [_pairs(4, seed=2), _pairs(8, seed=3)], **framework.eval_options)
        calls.append("test")
        run.test(module, _pairs(4, seed=4), **framework.eval_options)
        calls.append("predict")
        predictions = run.predict(module, _pairs(8, seed=5))
    return {
        "calls": calls,
        "predictions": [p.flatten().tolist() for p in predictions],
        "parameters": [p.detach().flatten().tolist() for p in module.parameters()],
    }


def test_batch_transfer_hooks_as_in_lightning() -> None:
    seen = {framework.name: _run(framework) for framework in BOTH}
    assert seen["trainer"] == seen["lightning"]
    hooks = [c[:3] for c in seen["trainer"]["calls"] if isinstance(c, tuple) and len(c) == 4]
    assert ("before", "sanity_checking", 0) in hooks and ("after", "validating", 1) in hooks


def _datamodule(framework: Framework, calls: list[str]) -> Any:
    base = pl.LightningDataModule if framework is LIGHTNING else trainer.DataModule

    class Doubling(base):  # type: ignore[misc, valid-type]
        def train_dataloader(self) -> DataLoader:
            return DataLoader(dataset(8), batch_size=4)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            calls.append("datamodule")
            x, y = batch
            return x * 2, y

    return Doubling()


def _both(framework: Framework, calls: list[str]) -> Any:
    class Both(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            calls.append("module")
            return batch

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Both()


def test_the_datamodule_hook_wins_over_the_module_one() -> None:
    seen = {}
    for framework in BOTH:
        calls: list[str] = []
        module = _both(framework, calls)
        with pytest.warns(UserWarning, match="both"):
            framework.trainer(**quiet(max_epochs=1)).fit(
                module, datamodule=_datamodule(framework, calls)
            )
        seen[framework.name] = (calls, [p.detach().flatten().tolist() for p in module.parameters()])
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][0] == ["datamodule", "datamodule"]
