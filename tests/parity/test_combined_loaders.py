"""Parity by difference: several train loaders in one fit, on lightning.pytorch 2.6 and on trainer.

Lightning reads a dict / list (nested as deep as wanted) of train loaders together in
"max_size_cycle" mode, and a ``CombinedLoader`` in the mode it names. Each scenario fits a
regression module whose ``training_step`` records every batch it gets (epoch, batch_idx and each
leaf's first value) and sums the leaves' losses; with a validation loader. Compared: the
batches, ``global_step``, ``num_training_batches``, ``callback_metrics``, final weights, and the
batch-transfer hooks' calls (once per whole batch, ``dataloader_idx=0``). Loaders do not shuffle
(trainer's shuffle order follows ``(seed, epoch)``, a documented difference). Lightning's run is
the expected value.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import trainer
from tests.parity.frameworks import LIGHTNING, TRAINER, dataset, quiet

pl = pytest.importorskip("lightning.pytorch")


def _leaves(batch: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, leaf batch) pairs; a leaf is one loader's batch ([x, y]) or None."""
    if batch is None or (isinstance(batch, list) and isinstance(batch[0], torch.Tensor)):
        return [(prefix, batch)]
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    return [leaf for key, value in items for leaf in _leaves(value, f"{prefix}/{key}")]


def _module(fw: Any, seen: list[Any], transfers: list[Any] | None) -> Any:
    class Several(fw.Module):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            parts = _leaves(batch)
            firsts = tuple(
                (key, None if leaf is None else round(float(leaf[0][0, 0]), 5))
                for key, leaf in parts
            )
            seen.append((self.current_epoch, batch_idx, type(batch).__name__, firsts))
            losses = [
                torch.nn.functional.mse_loss(self.net(leaf[0]), leaf[1])
                for _, leaf in parts
                if leaf is not None
            ]
            loss = torch.stack(losses).sum()
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    if transfers is not None:

        def on_before_batch_transfer(self, batch, dataloader_idx):
            if self.trainer.training:
                transfers.append((type(batch).__name__, len(_leaves(batch)), dataloader_idx))
            return batch

        Several.on_before_batch_transfer = on_before_batch_transfer
    return Several()


def _loaders(fw: Any, form: str, mode: str | None) -> Any:
    a = DataLoader(dataset(10, seed=1), batch_size=2)
    b = DataLoader(dataset(6, seed=2), batch_size=2)
    c = DataLoader(dataset(4, seed=3), batch_size=2)
    loaders = {
        "dict": {"a": a, "b": b},
        "list": [a, b, c],
        "list_of_one": [b],
        "nested": {"x": [a, b], "y": c},
    }[form]
    if mode is None:
        return loaders
    combined = pl.utilities.CombinedLoader if fw is LIGHTNING else trainer.data.CombinedLoader
    return combined(loaders, mode)


def _run(fw: Any, form: str, mode: str | None, options: dict[str, Any], hooks: bool) -> Any:
    seen: list[Any] = []
    transfers: list[Any] | None = [] if hooks else None
    module = _module(fw, seen, transfers)
    fit = fw.trainer(**quiet(max_epochs=2, num_sanity_val_steps=0, **options))
    fit.fit(module, _loaders(fw, form, mode), DataLoader(dataset(4, seed=5), batch_size=2))
    return {
        "seen": seen,
        "transfers": transfers,
        "global_step": fit.global_step,
        "num_training_batches": fit.num_training_batches,
        "metrics": {k: round(float(v), 5) for k, v in fit.callback_metrics.items()},
        "weights": [round(float(v), 5) for v in module.net.weight.flatten()],
    }


@pytest.mark.parametrize(
    ("form", "mode", "options", "hooks"),
    [
        ("dict", None, {}, False),
        ("list", None, {"val_check_interval": 2}, False),
        ("list_of_one", None, {}, False),
        ("nested", None, {}, True),
        ("dict", "min_size", {}, False),
        ("dict", "max_size", {}, True),
        ("list", "max_size_cycle", {"limit_train_batches": 0.5}, False),
        ("dict", None, {"accumulate_grad_batches": 2}, False),
        ("dict", None, {"overfit_batches": 2}, False),
        ("list", "min_size", {"limit_train_batches": 3, "max_steps": 4}, False),
        ("dict", None, {"check_val_every_n_epoch": 2, "limit_val_batches": 1}, False),
    ],
)
def test_several_train_loaders_read_as_lightning_reads_them(
    form: str, mode: str | None, options: dict[str, Any], hooks: bool
) -> None:
    expected = _run(LIGHTNING, form, mode, options, hooks)
    actual = _run(TRAINER, form, mode, options, hooks)
    assert expected["seen"]
    assert actual == expected


def test_a_combined_loader_read_on_its_own_yields_what_lightnings_yields() -> None:
    loaders = {"a": [1, 2, 3, 4, 5], "b": [10, 20]}
    for mode in ("min_size", "max_size_cycle", "max_size", "sequential"):
        expected = list(pl.utilities.CombinedLoader(loaders, mode))
        actual = list(trainer.data.CombinedLoader(loaders, mode))
        assert actual == expected, mode
        assert len(trainer.data.CombinedLoader(loaders, mode)) == len(expected), mode


@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size"])
def test_evaluation_reads_a_combined_loader_together_as_lightning(mode: str) -> None:
    """validate / test with a CombinedLoader read together: one batch of each loader per step,
    no dataloader_idx, one result; predict refuses it (Lightning does)."""

    def run(fw: Any) -> Any:
        seen: list[Any] = []

        class Evaluated(fw.Module):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.net = torch.nn.Linear(4, 1)

            def _loss(self, batch: Any) -> torch.Tensor:
                parts = [leaf for _, leaf in _leaves(batch) if leaf is not None]
                seen.append(tuple(round(float(leaf[0][0, 0]), 5) for leaf in parts))
                return sum(torch.nn.functional.mse_loss(self.net(x), y) for x, y in parts)

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self._loss(batch))

            def test_step(self, batch, batch_idx):
                self.log("test_loss", self._loss(batch))

            def predict_step(self, batch, batch_idx):
                return float(self._loss(batch))

        module = Evaluated()
        fit = fw.trainer(**quiet())
        results = [
            fit.validate(module, _loaders(fw, "dict", mode), **fw.eval_options),
            fit.test(module, _loaders(fw, "nested", mode), **fw.eval_options),
        ]
        results = [[{k: round(v, 5) for k, v in r.items()} for r in rs] for rs in results]
        with pytest.raises(ValueError, match="sequential"):  # both refuse it for predict
            fit.predict(module, _loaders(fw, "list", mode))
        return seen, results  # num_*_batches: one number here, a list in Lightning (documented)

    assert run(TRAINER) == run(LIGHTNING)
