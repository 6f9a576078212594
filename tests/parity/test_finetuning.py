"""Parity by difference: BaseFinetuning and BackboneFinetuning on lightning.pytorch 2.6 and trainer.

The same module (a backbone with BatchNorm, and a head) runs on both frameworks with the same
finetuning callback; at each epoch end a recorder copies every param group's learning rate and
size and which parameters require grad. The records, the callback's ``state_dict`` and the final
weights must agree, and a run resumed from the checkpoint of its second epoch (after the
backbone joined the optimizer) must end with the weights of the uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

pl = pytest.importorskip("lightning.pytorch")


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def _module(base: type) -> Any:
    class Transfer(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
            self.head = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.head(self.backbone(x)), y)

        def configure_optimizers(self):
            trainable = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.SGD(trainable, lr=0.05, momentum=0.9)

    return Transfer()


def _custom(base: type) -> Any:
    class UnfreezeBody(base):  # type: ignore[misc, valid-type]
        """The linear layer from epoch 1 at lr 0.01, without its BatchNorm."""

        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone, train_bn=False)

        def finetune_function(self, pl_module, epoch, optimizer):
            if epoch == 1:
                self.unfreeze_and_add_param_group(
                    pl_module.backbone, optimizer, lr=0.01, train_bn=False
                )

    return UnfreezeBody()


def _callback(framework: str, kind: str) -> Any:
    callbacks = pl.callbacks if framework == "lightning" else trainer.callbacks
    if kind == "custom":
        return _custom(callbacks.BaseFinetuning)
    return callbacks.BackboneFinetuning(
        unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5, backbone_initial_ratio_lr=0.1
    )


def _run(
    framework: str, root: Path, kind: str, max_epochs: int = 4, ckpt_path: Any = None
) -> dict[str, Any]:
    seen: list[Any] = []

    def record(trainer_: Any, module: Any) -> None:
        groups = trainer_.optimizers[0].param_groups
        frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
        seen.append(([(round(g["lr"], 8), len(g["params"])) for g in groups], frozen))

    options = {
        "max_epochs": max_epochs,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(root),
    }
    finetuning = _callback(framework, kind)
    if framework == "lightning":
        saver = pl.callbacks.ModelCheckpoint(dirpath=root / "ckpts", save_top_k=-1)
        recorder = pl.callbacks.LambdaCallback(on_train_epoch_end=record)
        fit = pl.Trainer(callbacks=[finetuning, recorder, saver], accelerator="cpu", **options)
        module = _module(pl.LightningModule)
    else:
        saver = trainer.callbacks.ModelCheckpoint(dirpath=root / "ckpts", save_top_k=-1)
        recorder = trainer.callbacks.LambdaCallback(on_train_epoch_end=record)
        fit = trainer.Trainer(callbacks=[finetuning, recorder, saver], **options)
        module = _module(trainer.TrainModule)
    fit.fit(module, _loader(), ckpt_path=ckpt_path)
    state = finetuning.state_dict()
    return {
        "seen": seen,
        "state": {
            k: (v if k != "internal_optimizer_metadata" else _plain(v)) for k, v in state.items()
        },
        "weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
    }


def _plain(metadata: dict[int, list[dict[str, Any]]]) -> dict[int, list[Any]]:
    """The saved groups: parameter names and learning rate (the comparable part)."""
    return {
        index: [(group["params"], round(group["lr"], 8)) for group in groups]
        for index, groups in metadata.items()
    }


def _assert_weights_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["backbone", "custom"])
def test_finetuning_matches_lightning(tmp_path: Path, kind: str) -> None:
    expected = _run("lightning", tmp_path / "lightning", kind)
    received = _run("trainer", tmp_path / "trainer", kind)
    assert received["seen"] == expected["seen"]
    assert received["state"] == expected["state"]
    _assert_weights_equal(received["weights"], expected["weights"])
    assert len(received["seen"][-1][0]) == 2  # the backbone joined as a second param group


def test_a_resumed_run_rebuilds_the_param_groups(tmp_path: Path) -> None:
    full = _run("trainer", tmp_path / "full", "backbone")
    second_epoch = next((tmp_path / "full" / "ckpts").glob("epoch=1-*"))
    resumed = _run("trainer", tmp_path / "resumed", "backbone", ckpt_path=second_epoch)
    assert resumed["seen"] == full["seen"][2:]
    assert resumed["state"] == full["state"]
    _assert_weights_equal(resumed["weights"], full["weights"])


def test_backbone_finetuning_needs_a_backbone(tmp_path: Path) -> None:
    class NoBackbone(trainer.TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    fit = trainer.Trainer(
        max_epochs=1,
        callbacks=[trainer.callbacks.BackboneFinetuning()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    with pytest.raises(Exception, match="backbone"):  # setup freezes module.backbone first
        fit.fit(NoBackbone(), _loader())
