"""A small training job for the resume tests; run as a script by the subprocess tests.

``python resume_job.py ROOT MODE`` trains on CPU with shuffle, dropout, momentum and a scheduler.
MODE "full" trains 3 epochs; "signal" sends itself SIGTERM at global step 13; "kill" SIGKILLs itself
at step 13 after checkpoints every 5 steps; "resume" resumes from ckpt_path="last". Final weights
go to ROOT/final-MODE.safetensors.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.callbacks import Callback, ModelCheckpoint


class Net(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)]


def data(num_workers: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=generator)
    return DataLoader(
        TensorDataset(x, x.sum(1, keepdim=True)),
        batch_size=4,
        shuffle=True,
        num_workers=num_workers,
    )


class SelfSignal(Callback):
    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def main(root: str, mode: str) -> None:
    torch.manual_seed(1)
    module = Net()
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=5, save_top_k=-1)
    ]
    if mode == "signal":
        callbacks.append(SelfSignal(13, signal.SIGTERM))
    if mode == "kill":
        callbacks.append(SelfSignal(13, signal.SIGKILL))
    fit = trainer.Trainer(
        max_epochs=3,
        default_root_dir=root,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    fit.fit(module, data(), ckpt_path="last" if mode == "resume" else None)
    save_file(
        {k: v.contiguous() for k, v in module.state_dict().items()},
        os.path.join(root, f"final-{mode}.safetensors"),
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
