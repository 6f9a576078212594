"""Tests of trainer/data/combined.py: CombinedLoader's modes, and several train loaders in a fit
(exact resume, the accumulation window, checkpoints, evaluation, refused modes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.callbacks import Callback
from trainer.data import CombinedLoader
from trainer.errors import CheckpointError, ConfigurationError

QUIET = dict(
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
)


def _data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class Several(TrainModule):
    """Sums the losses of every loader's batch; records (epoch, batch_idx, each first value)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.seen: list[Any] = []
        self.transfers: list[Any] = []

    def training_step(self, batch, batch_idx):
        parts = {k: v for k, v in batch.items() if v is not None}
        self.seen.append(
            (
                self.current_epoch,
                batch_idx,
                {k: round(float(v[0][0, 0]), 5) for k, v in parts.items()},
            )
        )
        losses = [torch.nn.functional.mse_loss(self.net(x), y) for x, y in parts.values()]
        return torch.stack(losses).sum()

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loaders(mode: str | None = None) -> Any:
    loaders = {
        "long": DataLoader(_data(10, 1), batch_size=2, shuffle=True),
        "short": DataLoader(_data(6, 2), batch_size=2, shuffle=True),
    }
    return loaders if mode is None else CombinedLoader(loaders, mode)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("min_size", [({"a": 0, "b": 10}, 0, 0), ({"a": 1, "b": 20}, 1, 0)]),
        (
            "max_size_cycle",
            [({"a": 0, "b": 10}, 0, 0), ({"a": 1, "b": 20}, 1, 0), ({"a": 2, "b": 10}, 2, 0)],
        ),
        (
            "max_size",
            [({"a": 0, "b": 10}, 0, 0), ({"a": 1, "b": 20}, 1, 0), ({"a": 2, "b": None}, 2, 0)],
        ),
        ("sequential", [(0, 0, 0), (1, 1, 0), (2, 2, 0), (10, 0, 1), (20, 1, 1)]),
    ],
)
def test_each_mode_yields_batch_batch_idx_and_dataloader_idx(mode, expected) -> None:
    combined = CombinedLoader({"a": range(3), "b": [10, 20]}, mode)
    assert list(combined) == expected
    assert len(combined) == len(expected)
    assert combined.mode == mode
    assert combined.flattened == [range(3), [10, 20]]


def test_nested_structures_come_back_with_a_batch_at_each_leaf() -> None:
    combined = CombinedLoader({"x": [range(2), range(5, 7)], "y": (range(8, 10),)}, "min_size")
    assert [batch for batch, _, _ in combined] == [
        {"x": [0, 5], "y": (8,)},
        {"x": [1, 6], "y": (9,)},
    ]


def test_an_unknown_mode_and_a_sequential_fit_are_refused_naming_the_modes() -> None:
    with pytest.raises(ConfigurationError, match=r"CombinedLoader: mode='cycle' is not one of"):
        CombinedLoader([range(2)], "cycle")
    fit = Trainer(max_epochs=1, **QUIET)
    with pytest.raises(ConfigurationError, match=r"mode='sequential'.*'max_size_cycle'"):
        fit.fit(Several(), _loaders("sequential"))
    assert fit.global_step == 0


@pytest.mark.parametrize("mode", [None, "max_size", "min_size"])
@pytest.mark.parametrize("stop", [2, 4, 7])
def test_a_fit_resumed_mid_epoch_sees_the_batches_it_would_have_seen(
    tmp_path: Path, mode: str | None, stop: int
) -> None:
    """Shuffled loaders of 5 and 3 batches; at step 4 the short one is in its second pass."""
    full = Several()
    Trainer(max_epochs=3, seed=3, **QUIET).fit(full, _loaders(mode))
    first = Several()
    stopped = Trainer(max_epochs=3, max_steps=stop, seed=3, **QUIET)
    stopped.fit(first, _loaders(mode))
    stopped.save_checkpoint(tmp_path / "ckpt")
    second = Several()
    Trainer(max_epochs=3, seed=3, **QUIET).fit(second, _loaders(mode), ckpt_path=tmp_path / "ckpt")
    assert first.seen + second.seen == full.seen
    assert torch.equal(second.net.weight, full.net.weight)
    assert len(full.seen) == (9 if mode == "min_size" else 15)


def test_the_accumulation_window_ends_with_the_combined_epoch_not_a_shorter_loader() -> None:
    """5 combined batches an epoch, the short loader ends after 3: steps after batches 2, 4, 5."""
    steps: list[int] = []

    class Recording(Several):
        def on_before_optimizer_step(self, optimizer):
            steps.append(len(self.seen))

    fit = Trainer(max_epochs=2, accumulate_grad_batches=2, **QUIET)
    fit.fit(Recording(), _loaders())
    assert steps == [2, 4, 5, 7, 9, 10]
    assert fit.global_step == 6
    assert fit.num_training_batches == 5


def test_batch_transfer_hooks_get_the_whole_batch_once(tmp_path: Path) -> None:
    calls: list[Any] = []

    class Hooked(Several):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            if self.trainer.training:
                calls.append((sorted(batch), dataloader_idx))
            return batch

    Trainer(max_epochs=1, limit_train_batches=2, **QUIET).fit(Hooked(), _loaders("min_size"))
    assert calls == [(["long", "short"], 0)] * 2


def test_a_checkpoint_of_other_train_loaders_is_refused_naming_them(tmp_path: Path) -> None:
    stopped = Trainer(max_epochs=2, max_steps=3, **QUIET)
    stopped.fit(Several(), _loaders())
    stopped.save_checkpoint(tmp_path / "ckpt")
    one = DataLoader(_data(6, 2), batch_size=2)
    for other in (_loaders("min_size"), {"only": one}, one):
        with pytest.raises(CheckpointError, match=r"train loaders read (in mode|together)"):
            Trainer(max_epochs=2, **QUIET).fit(Several(), other, ckpt_path=tmp_path / "ckpt")


def test_evaluation_takes_a_combined_loader_sequential_as_a_list_else_together() -> None:
    module = Several()
    loaders = [DataLoader(_data(4, 5), batch_size=2), DataLoader(_data(2, 6), batch_size=2)]
    results = Trainer(**QUIET).validate(module, CombinedLoader(loaders, "sequential"))
    assert [sorted(r) for r in results] == [
        ["val_loss/dataloader_idx_0"],
        ["val_loss/dataloader_idx_1"],
    ]

    class Together(Several):
        def validation_step(self, batch, batch_idx):  # [batch of loader 0, batch of loader 1]
            self.log("val_loss", sum(self.net(x).pow(2).mean() for x, _ in batch))

    together = Trainer(**QUIET)
    assert [
        sorted(r) for r in together.validate(Together(), CombinedLoader(loaders, "min_size"))
    ] == [
        ["val_loss"]  # one batch of each per step: one loader, no dataloader_idx
    ]
    assert together.num_val_batches == 1
    with pytest.raises(ConfigurationError, match=r"predict\(CombinedLoader.*'min_size'"):
        Trainer(**QUIET).predict(module, CombinedLoader(loaders, "min_size"))


def test_the_batch_size_finder_refuses_several_train_loaders_by_name() -> None:
    from trainer.callbacks import BatchSizeFinder

    class FromMethod(Several):
        batch_size = 2

        def train_dataloader(self):
            return _loaders()

    fit = Trainer(max_epochs=1, callbacks=[BatchSizeFinder()], **QUIET)
    with pytest.raises(ConfigurationError, match=r"BatchSizeFinder scales one train dataloader"):
        fit.fit(FromMethod())


def test_module_loaders_reloaded_every_epoch_and_the_prepared_structure() -> None:
    built: list[int] = []

    class FromMethod(Several):
        def train_dataloader(self):
            built.append(self.current_epoch)
            return _loaders("max_size")

    seeds: list[list[int]] = []

    class Seeds(Callback):
        def on_train_epoch_start(self, trainer, module):
            seeds.append([loader.seed for loader in trainer.train_dataloader.flattened])

    fit = Trainer(
        max_epochs=2, reload_dataloaders_every_n_epochs=1, seed=1, callbacks=[Seeds()], **QUIET
    )
    module = FromMethod()
    fit.fit(module)
    assert built == [0, 1]
    assert seeds[0] == seeds[1] and None not in seeds[0]  # the reloaded loaders keep their seeds
    assert len(module.seen) == 10
    assert sorted(fit.train_dataloader.iterables) == ["long", "short"]
    assert fit.train_dataloader["short"].batch_size == 2  # the prepared loader, by its key
    assert fit.train_dataloader.mode == "max_size"


def test_persistent_workers_of_every_loader_end_with_the_fit() -> None:
    """As for one loader: the workers kept between epochs end when fit returns."""
    loaders = {
        name: DataLoader(_data(n, seed), batch_size=2, num_workers=1, persistent_workers=True)
        for name, n, seed in (("long", 8, 1), ("short", 4, 2))
    }
    fit = Trainer(max_epochs=2, **QUIET)
    fit.fit(Several(), loaders)
    for prepared in fit.train_dataloader.flattened:
        for loader in (prepared.base_dataloader, prepared._fetch_loader):
            assert getattr(loader, "_iterator", None) is None  # no worker left running
