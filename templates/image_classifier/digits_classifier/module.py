"""``DigitsClassifier``: the CNN plus its steps, metrics and optimizer (a ``TrainModule``).

Distribution, precision, logging and checkpointing are the Trainer's arguments (the ``trainer:``
section of the run config), never code here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from trainer import TrainModule

from digits_classifier.model import NUM_CLASSES, build_model

__all__ = ["DigitsClassifier"]


class DigitsClassifier(TrainModule):
    """Cross-entropy on the CNN's logits; accuracy from torchmetrics; AdamW with cosine decay.

    Args:
        lr: AdamW's peak learning rate (decays to zero over the run).
        weight_decay: AdamW's decoupled weight decay.
        dropout: dropout before each linear layer.
    """

    def __init__(self, lr: float = 3e-3, weight_decay: float = 1e-2, dropout: float = 0.25) -> None:
        super().__init__()
        from torchmetrics.classification import Accuracy

        self.save_hyperparameters()
        self.model = build_model(dropout)
        # One Metric per stage: its state must not mix validation and test batches.
        self.val_acc = Accuracy(task="multiclass", num_classes=NUM_CLASSES)
        self.test_acc = Accuracy(task="multiclass", num_classes=NUM_CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", (logits.argmax(dim=1) == labels).float().mean(), on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val/loss", F.cross_entropy(logits, labels), prog_bar=True)
        self.val_acc.update(logits, labels)
        self.log("val/acc", self.val_acc, prog_bar=True)  # computed and reset at epoch end

    def test_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("test/loss", F.cross_entropy(logits, labels))
        self.test_acc.update(logits, labels)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        return self(images).argmax(dim=1)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        # Cosine decay to zero over the whole run, stepped after every optimizer step.
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
