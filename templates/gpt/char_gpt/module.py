"""``GPTModule``: the GPT plus its loss, optimizer and a text sample at the end of training.

Distribution (``strategy: single | ddp | fsdp | deepspeed``) and number format (``precision``)
are the Trainer's arguments, set in the run config: nothing here changes with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from trainer import ConfigurationError, TrainModule

from char_gpt.datamodule import VOCAB_SIZE, decode, encode
from char_gpt.model import GPT, sample_tokens

__all__ = ["GPTModule"]


class GPTModule(TrainModule):
    """Next-token cross-entropy; AdamW with linear warm-up then cosine decay to 10%.

    Args:
        vocab_size / block_size / n_layer / n_head / n_embd / dropout: the GPT's shape.
        lr: the peak learning rate.
        weight_decay: AdamW's decay, on matrices (weights and embeddings) only, not on biases
            or LayerNorm gains.
        warmup_fraction: the share of all optimizer steps spent warming up.
        sample_length: characters to sample after training and print (0: none).
        sample_prompt: the text the sample continues.
        sample_temperature: below 1 sharpens the distribution the sample draws from.
    """

    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.1,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        warmup_fraction: float = 0.05,
        sample_length: int = 200,
        sample_prompt: str = "MARCIUS:\n",
        sample_temperature: float = 0.8,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
        self.sample_text: str | None = None  # set by on_fit_end when sample_length > 0

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _loss(self, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), prog_bar=True)

    def configure_optimizers(self) -> dict[str, Any]:
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
            betas=(0.9, 0.95),
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = max(1, int(total * self.hparams.warmup_fraction))

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_fit_end(self) -> None:
        """Sample ``sample_length`` characters; every process samples, the first one prints."""
        if self.hparams.sample_length <= 0:
            return
        self.sample_text = self.sample(self.hparams.sample_prompt, self.hparams.sample_length)
        if self.global_rank == 0:
            print(f"--- sample ---\n{self.sample_text}\n--------------")

    def sample(self, prompt: str, length: int, *, seed: int = 0) -> str:
        """``prompt`` continued by ``length`` sampled tokens (seeded: the same on every call)."""
        was_training = self.training
        self.eval()
        generator = torch.Generator(device=self.device).manual_seed(seed)
        idx = encode(prompt or "\n").unsqueeze(0).to(self.device)
        try:
            out = sample_tokens(
                self._engine_forward(),
                idx,
                length,
                block_size=self.hparams.block_size,
                temperature=self.hparams.sample_temperature,
                top_k=None,
                generator=generator,
            )
        finally:
            self.train(was_training)
        return decode(out[0])

    def _engine_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` through the Trainer's engine wrapper when there is one: a sharded model
        (fsdp, deepspeed zero3) gathers its weights there, not in this module's own call."""
        try:
            wrapped = self.trainer.model
        except ConfigurationError:  # not attached to a Trainer: a plain module
            wrapped = None
        if wrapped is None:
            return self
        return lambda ids: wrapped("forward", ids)
