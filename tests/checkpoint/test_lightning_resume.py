"""A run trained by real PyTorch Lightning continues with this Trainer from its ``.ckpt``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.callbacks import Callback
from trainer.checkpoint.legacy import load_weights_file

L = pytest.importorskip("lightning")

BATCHES_PER_EPOCH = 10


class Steps:
    """The step code both frameworks run (Lightning's and this Trainer's module share it)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.batches_seen: list[tuple[int, int]] = []

    def training_step(self, batch, batch_idx):
        self.batches_seen.append((self.current_epoch, batch_idx))
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class LightningNet(Steps, L.LightningModule):
    pass


class Net(Steps, TrainModule):
    pass


class StateAtStart(Callback):
    """What the resumed run holds when training starts."""

    def on_train_start(self, trainer, module):
        self.global_step = trainer.global_step
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}
        self.optimizer_step = int(trainer.optimizers[0].state_dict()["state"][0]["step"])
        self.scheduler_epoch = trainer.lr_scheduler_configs[0].scheduler.last_epoch


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES_PER_EPOCH * 4, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Lightning epochs with a checkpoint at step 15 (mid-epoch) and at each epoch end."""
    root = tmp_path_factory.mktemp("lightning")
    callbacks = [
        L.pytorch.callbacks.ModelCheckpoint(root / "mid", every_n_train_steps=15, save_top_k=-1),
        L.pytorch.callbacks.ModelCheckpoint(root / "epochs", every_n_epochs=1, save_top_k=-1),
    ]
    lightning_trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    lightning_trainer.fit(LightningNet(), _loader())
    return root


def _resume(checkpoint: Path, tmp_path: Path) -> tuple[Net, StateAtStart, Trainer]:
    module, at_start = Net(), StateAtStart()
    trainer = Trainer(
        max_epochs=3,
        callbacks=[at_start],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, _loader(), ckpt_path=checkpoint)
    return module, at_start, trainer


def test_resume_from_epoch_end(lightning_run: Path, tmp_path: Path):
    checkpoint = lightning_run / "epochs" / "epoch=1-step=20.ckpt"
    module, at_start, trainer = _resume(checkpoint, tmp_path)

    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert at_start.weights.keys() == saved.keys()
    assert all(torch.equal(at_start.weights[k], saved[k]) for k in saved)
    assert (at_start.global_step, at_start.optimizer_step, at_start.scheduler_epoch) == (20, 20, 20)
    assert module.batches_seen == [(2, i) for i in range(BATCHES_PER_EPOCH)]  # only epoch 3
    assert (trainer.global_step, trainer.current_epoch) == (30, 3)


def test_resume_mid_epoch(lightning_run: Path, tmp_path: Path):
    checkpoint = lightning_run / "mid" / "epoch=1-step=15.ckpt"
    module, at_start, trainer = _resume(checkpoint, tmp_path)

    assert (at_start.global_step, at_start.optimizer_step, at_start.scheduler_epoch) == (15, 15, 15)
    expected = [(1, i) for i in range(5, BATCHES_PER_EPOCH)]  # the rest of epoch 2 ...
    expected += [(2, i) for i in range(BATCHES_PER_EPOCH)]  # ... then epoch 3
    assert module.batches_seen == expected
    assert (trainer.global_step, trainer.current_epoch) == (30, 3)


def test_lightning_only_state_is_dropped(lightning_run: Path):
    checkpoint = load_weights_file(lightning_run / "mid" / "epoch=1-step=15.ckpt")

    assert checkpoint["progress"] == {
        "epoch": 1,
        "global_step": 15,
        "batch_idx": 5,
        "last_val_step": -1,
    }
    assert not {"loops", "callbacks", "pytorch-lightning_version"} & checkpoint.keys()
    assert {"state_dict", "optimizer_states", "lr_schedulers"} <= checkpoint.keys()


def test_the_datamodule_state_of_a_lightning_checkpoint_is_restored_before_its_loaders(
    tmp_path: Path,
):
    """Lightning saves a DataModule's state under its class name; the resumed run's fresh
    DataModule gets it back before it is asked for the train loader."""
    seen: list[int] = []

    def phased(base: type) -> type:
        class Phased(base):  # type: ignore[misc, valid-type]
            def __init__(self, phase: int = 0) -> None:
                super().__init__()
                self.phase = phase

            def train_dataloader(self):
                seen.append(self.phase)
                return _loader()

            def state_dict(self):
                return {"phase": self.phase}

            def load_state_dict(self, state):
                self.phase = state["phase"]

        return Phased

    saving = L.pytorch.callbacks.ModelCheckpoint(tmp_path)
    L.Trainer(
        max_epochs=1, accelerator="cpu", callbacks=[saving], logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    ).fit(LightningNet(), datamodule=phased(L.LightningDataModule)(phase=3))  # fmt: skip
    import trainer

    run = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    run.fit(Net(), datamodule=phased(trainer.DataModule)(), ckpt_path=saving.best_model_path)
    assert seen == [3, 3] and run.global_step == 2 * BATCHES_PER_EPOCH
