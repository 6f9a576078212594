"""Parity by difference: what TQDMProgressBar shows, on lightning.pytorch 2.6 and on trainer.

The same module runs fit (with a sanity check), validate and test on both frameworks, each with
its TQDMProgressBar subclassed only to record, after every hook that redraws, each bar's
description, count, total and postfix (``v_num`` and the ``prog_bar=True`` metrics, as tqdm
formats them). Rates and times are not compared: they depend on the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

pl = pytest.importorskip("lightning.pytorch")

_BAR_HOOKS = {  # hook -> the bar it redraws, read after the hook (before, for the closing ones)
    "on_train_batch_end": "train",
    "on_train_epoch_end": "train",
    "on_validation_batch_end": "val",
    "on_test_batch_end": "test",
    "on_predict_batch_end": "predict",
}
_CLOSING_HOOKS = {"on_validation_end": "val", "on_sanity_check_end": "val", "on_test_end": "test"}


def _loader(n: int, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)


def _module(base: type) -> Any:
    class Regression(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def _loss(self, batch: Any) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch), prog_bar=True)

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self._loss(batch), prog_bar=True)

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regression()


def _recording_bar(base: type, seen: list[tuple[Any, ...]], **options: Any) -> Any:
    def snapshot(self: Any, hook: str, kind: str) -> None:
        bar = getattr(self, f"_{kind}_progress_bar")
        if bar is not None and not bar.disable:
            seen.append((hook, bar.desc, bar.n, bar.total, bar.postfix))

    def after(hook: str, kind: str) -> Callable[..., None]:
        def wrapped(self: Any, *args: Any) -> None:
            getattr(base, hook)(self, *args)
            snapshot(self, hook, kind)

        return wrapped

    def before(hook: str, kind: str) -> Callable[..., None]:
        def wrapped(self: Any, *args: Any) -> None:
            snapshot(self, hook, kind)
            getattr(base, hook)(self, *args)

        return wrapped

    methods = {hook: after(hook, kind) for hook, kind in _BAR_HOOKS.items()}
    methods.update({hook: before(hook, kind) for hook, kind in _CLOSING_HOOKS.items()})
    return type("Recording", (base,), methods)(**options)


def _run(framework: str, root: Path, **bar_options: Any) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []
    options = {"max_epochs": 2, "num_sanity_val_steps": 2, "enable_model_summary": False}
    options["enable_checkpointing"] = False
    if framework == "lightning":
        bar = _recording_bar(pl.callbacks.TQDMProgressBar, seen, **bar_options)
        logger = pl.loggers.CSVLogger(str(root), name="run", version=0)
        fit = pl.Trainer(callbacks=[bar], logger=logger, accelerator="cpu", **options)
        module = _module(pl.LightningModule)
        quiet = {"verbose": False}
    else:
        bar = _recording_bar(trainer.callbacks.TQDMProgressBar, seen, **bar_options)
        logger = trainer.loggers.CSVLogger(str(root), name="run", version=0)
        fit = trainer.Trainer(callbacks=[bar], logger=logger, **options)
        module = _module(trainer.TrainModule)
        quiet = {}
    fit.fit(module, _loader(10), _loader(6, seed=1))
    fit.validate(module, _loader(6, seed=1), **quiet)
    fit.test(module, _loader(4, seed=2), **quiet)
    fit.predict(module, _loader(4, seed=2))
    return seen


@pytest.mark.parametrize(
    "bar_options",
    [{}, {"refresh_rate": 2, "leave": True}],
    ids=["defaults", "refresh-2-leave"],
)
def test_tqdm_bars_show_what_lightning_shows(tmp_path: Path, bar_options: dict[str, Any]) -> None:
    expected = _run("lightning", tmp_path / "lightning", **bar_options)
    received = _run("trainer", tmp_path / "trainer", **bar_options)
    assert received == expected
    descriptions = {desc.removesuffix(": ") for _, desc, *_ in received}
    assert {"Epoch 0", "Epoch 1", "Validation DataLoader 0", "Testing DataLoader 0"} <= descriptions


def test_refresh_rate_zero_shows_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    seen = _run("trainer", tmp_path, refresh_rate=0)
    assert seen == [] and "Epoch 0:" not in capsys.readouterr().out  # tqdm's description


def test_tqdm_padding_matches_lightning() -> None:
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm as LightningTqdm

    from trainer.callbacks.tqdm_progress import Tqdm

    for value in (1.0, 0.5, 12, "3", "abc", 1e-8, 123456.0):
        assert Tqdm.format_num(value) == LightningTqdm.format_num(value)


def test_a_tqdm_bar_replaces_the_default_bar(tmp_path: Path) -> None:
    fit = trainer.Trainer(callbacks=[trainer.callbacks.TQDMProgressBar()], logger=False)
    bars = [cb for cb in fit.callbacks if isinstance(cb, trainer.callbacks.ProgressBar)]
    assert len(bars) == 1


def test_rich_bar_takes_lightnings_arguments_and_theme() -> None:
    """A Lightning project's RichProgressBar call ports unchanged: the same keywords, and a
    RichProgressBarTheme with Lightning's fields and defaults."""
    import dataclasses

    from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBarTheme

    ours = trainer.callbacks.RichProgressBarTheme
    fields = {f.name: f.default for f in dataclasses.fields(ours)}
    assert fields == {f.name: f.default for f in dataclasses.fields(RichProgressBarTheme)}
    options = dict(refresh_rate=5, leave=False, console_kwargs={"width": 90})
    lightning_bar = pl.callbacks.RichProgressBar(theme=RichProgressBarTheme(), **options)
    bar = trainer.callbacks.RichProgressBar(theme=ours(metrics="green"), **options)
    assert bar.refresh_rate == lightning_bar.refresh_rate
    disabled = [
        pl.callbacks.RichProgressBar(refresh_rate=0),
        trainer.callbacks.RichProgressBar(refresh_rate=0),
    ]
    assert [b.is_disabled for b in disabled] == [True, True]
