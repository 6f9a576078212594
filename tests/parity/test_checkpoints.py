"""Parity by difference: which checkpoints ModelCheckpoint keeps, on lightning.pytorch and trainer.

The same module and data run on both; the names kept in ``dirpath`` (Lightning's ``.ckpt`` files,
trainer's checkpoint directories: compared without the suffix, a deliberate difference) and the
global step each kept checkpoint holds must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, regression

pl = pytest.importorskip("lightning.pytorch")


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)


def _module(base: type) -> Any:
    class Regression(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Regression()


def _kept(framework: str, folder: Path, **checkpoint_options: Any) -> dict[str, int]:
    """Run 3 epochs; return {checkpoint name without suffix: the global step it holds}."""
    options = {
        "max_epochs": 3,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    if framework == "lightning":
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, **checkpoint_options)
        fit = pl.Trainer(callbacks=[callback], accelerator="cpu", **options)
        fit.fit(_module(pl.LightningModule), _loader())
        return {
            path.stem: torch.load(path, weights_only=False)["global_step"]
            for path in folder.glob("*.ckpt")
        }
    callback = trainer.callbacks.ModelCheckpoint(dirpath=folder, **checkpoint_options)
    fit = trainer.Trainer(callbacks=[callback], **options)
    fit.fit(_module(trainer.TrainModule), _loader())
    return {
        path.name: json.loads((path / "manifest.json").read_text())["global_step"]
        for path in folder.iterdir()
        if not path.name.startswith(".")
    }


@pytest.mark.parametrize(
    "options",
    [
        # #12: re-saving under one name must never delete the checkpoint it has just written.
        {"filename": "model", "monitor": None, "save_top_k": 1},
        {"filename": "model", "monitor": None, "save_top_k": 1, "save_last": True},
        {"monitor": "loss", "mode": "min", "save_top_k": 2},
        {"monitor": "loss", "mode": "max", "save_top_k": 1, "save_last": True},
        {"monitor": None, "save_top_k": -1, "every_n_epochs": 2},
    ],
    ids=["same-name", "same-name+last", "top2-min", "top1-max+last", "every-2-epochs"],
)
def test_kept_checkpoints_match_lightning(tmp_path: Path, options: dict[str, Any]) -> None:
    expected = _kept("lightning", tmp_path / "lightning", **options)
    assert expected, "Lightning kept no checkpoint: the scenario is wrong"
    kept = _kept("trainer", tmp_path / "trainer", **options)
    if options.get("save_last") and options.get("monitor"):
        # Deliberate difference (docs/migration/lightning.md): Lightning 2.6 refreshes last.ckpt
        # only when a top-k checkpoint is saved, so it can lag; trainer's `last` is always the
        # state at the end of the newest epoch (what fit(ckpt_path="last") should resume).
        assert kept.pop("last") == 12 and expected.pop("last") <= 12
    assert kept == expected


def _run_after_a_crash(fw: Any, folder: Path) -> list[Any]:
    """A fit fails at step 5 with an OnExceptionCheckpoint; the script runs again unchanged."""
    outcome: list[Any] = []

    class Crashing(regression(fw.Module)):  # type: ignore[misc]
        crash_at = 5

        def training_step(self, batch, batch_idx):
            if self.global_step == self.crash_at:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

        def on_train_start(self):
            outcome.append(("starts at", self.global_step))

    for crash_at in (5, -1):
        fit = fw.trainer(
            callbacks=[fw.callbacks.OnExceptionCheckpoint(dirpath=folder)],
            **quiet(max_epochs=3, enable_checkpointing=True),
        )
        module = Crashing()
        module.crash_at = crash_at
        try:
            fit.fit(module, loader(8))
        except RuntimeError:
            outcome.append(("crashed at", fit.global_step))
    outcome.append((Path(fit.ckpt_path).stem, fit.global_step))
    return outcome


def test_a_script_run_again_after_a_crash_resumes_from_its_on_exception_checkpoint(
    tmp_path: Path,
) -> None:
    """Lightning's rule: fit(ckpt_path=None) with an OnExceptionCheckpoint resumes from the
    newest checkpoint it (or save_last) wrote. trainer started afresh."""
    with pytest.warns(UserWarning):
        expected = _run_after_a_crash(LIGHTNING, tmp_path / "lightning")
    assert expected == [
        ("starts at", 0),
        ("crashed at", 5),
        ("starts at", 5),
        ("on_exception", 12),
    ]
    with pytest.warns(UserWarning, match="OnExceptionCheckpoint"):
        assert _run_after_a_crash(TRAINER, tmp_path / "trainer") == expected


def _resumed_with_a_datamodule(fw: Any, folder: Path) -> list[Any]:
    """A DataModule whose training data depends on its state (a curriculum's phase, a vocabulary
    built in the first run): the resumed script passes a fresh one and relies on the checkpoint.
    What each ``train_dataloader`` call saw, the order of the restore calls, final weights."""
    from tests.parity.frameworks import dataset

    seen: list[Any] = []
    base = pl.LightningDataModule if fw is LIGHTNING else trainer.DataModule

    class Phased(base):  # type: ignore[misc, valid-type]
        def __init__(self, phase: int = 0) -> None:
            super().__init__()
            self.phase = phase

        def train_dataloader(self):
            seen.append(("train_dataloader", self.phase))
            x, y = dataset(8).tensors
            return DataLoader(TensorDataset(x * (1 + self.phase), y), batch_size=2)

        def state_dict(self):
            return {"phase": self.phase}

        def load_state_dict(self, state):
            seen.append(("datamodule.load_state_dict", state))
            self.phase = state["phase"]

    class Module(regression(fw.Module)):  # type: ignore[misc]
        def on_load_checkpoint(self, checkpoint):
            seen.append(("module.on_load_checkpoint", checkpoint["global_step"]))

    saving = fw.callbacks.ModelCheckpoint(dirpath=folder)
    first = fw.trainer(max_epochs=1, callbacks=[saving], **quiet(enable_checkpointing=True))
    first.fit(Module(), datamodule=Phased(2))
    module = Module()
    resumed = fw.trainer(max_epochs=2, **quiet())
    resumed.fit(module, datamodule=Phased(), ckpt_path=saving.best_model_path)
    weights = [round(v, 5) for v in module.net.weight.flatten().tolist()]
    return [seen, resumed.global_step, weights]


def test_a_resumed_fit_builds_its_train_loader_from_the_restored_datamodule(
    tmp_path: Path,
) -> None:
    """Lightning restores the DataModule's state before asking it for dataloaders, in fit as in
    evaluation; trainer's fit built the loader first, so the resumed epoch trained on the fresh
    DataModule's data: other weights, no error."""
    expected = _resumed_with_a_datamodule(LIGHTNING, tmp_path / "lightning")
    ours = _resumed_with_a_datamodule(TRAINER, tmp_path / "trainer")
    hook = ("module.on_load_checkpoint", 4)
    # Lightning calls the module's on_load_checkpoint before restoring the DataModule; trainer's
    # fit calls it once the whole checkpoint is read, after the optimizers (docs/migration).
    assert expected[0][1] == hook and ours[0][-1] == hook
    expected[0].remove(hook)
    ours[0].remove(hook)
    assert expected[0] == [
        ("train_dataloader", 2),
        ("datamodule.load_state_dict", {"phase": 2}),
        ("train_dataloader", 2),
    ]
    assert ours == expected


def _kept_after_a_resume(framework: str, folder: Path) -> dict[str, int]:
    """Fit 2 epochs (ModelCheckpoint's defaults: the newest one kept), then fit on to 4 epochs
    from that checkpoint; {name kept without suffix: its global step}."""
    fw = LIGHTNING if framework == "lightning" else TRAINER
    for max_epochs, resume in ((2, False), (4, True)):
        callback = fw.callbacks.ModelCheckpoint(dirpath=folder)
        fit = fw.trainer(
            callbacks=[callback], **quiet(max_epochs=max_epochs, enable_checkpointing=True)
        )
        fit.fit(_module(fw.Module), _loader(), ckpt_path=next(folder.iterdir()) if resume else None)
    if framework == "lightning":
        return {p.stem: torch.load(p, weights_only=False)["global_step"] for p in folder.iterdir()}
    return {
        path.name: json.loads((path / "manifest.json").read_text())["global_step"]
        for path in folder.iterdir()
    }


def test_a_resumed_fit_keeps_the_checkpoint_it_resumed_from(tmp_path: Path) -> None:
    expected = _kept_after_a_resume("lightning", tmp_path / "lightning")
    assert expected == {"epoch=1-step=8": 8, "epoch=3-step=16": 16}
    assert _kept_after_a_resume("trainer", tmp_path / "trainer") == expected
