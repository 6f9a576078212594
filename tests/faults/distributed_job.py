"""Jobs for the fault matrix on 1 or 2 processes (run directly, or by torchrun with gloo on CPU).

``python distributed_job.py ROOT MODE`` with MODE:

- "full": 3 epochs, checkpoints every 3 steps; final weights to ROOT/final-full.safetensors.
- "SIGTERM" / "SIGUSR1": rank 0 sends itself that signal at step 7 (as a scheduler would); the
  Trainer finishes the step, every rank saves, and the job exits with status 0.
- "SIGTERM-late": rank 0 sends itself SIGTERM in the last epoch's ``on_train_epoch_end``, after
  the ranks last compared flags: the job still saves and exits with status 0.
- "SIGTERM-test": after a 1-epoch fit, rank 1 sends itself SIGTERM during ``test()``: the test
  epoch finishes on both ranks, then both exit with status 0.
- "orphan": a long fit whose launcher the test kills with SIGKILL: each rank notices, saves
  a preemption checkpoint and exits.
- "resume": ``fit(ckpt_path="last")`` to the end; weights to ROOT/final-resume.safetensors.
- "raise" / "exit" / "sigkill": rank 1 raises, calls ``os._exit(1)`` or SIGKILLs itself at
  step 3 of a long fit, while rank 0 waits in a collective: the job must end promptly.
- "interrupt": rank 1 raises KeyboardInterrupt at step 3, its torchrun error file in a folder
  that does not exist: the KeyboardInterrupt must still be what rank 1 reports.
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

SIGNAL_STEP = 7
FAILURE_STEP = 3


class Net(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        # lr=0.05 diverges to NaN with batches of 4 (and NaN != NaN defeats the exact comparison).
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)]


def data(n: int = 48) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


class SignalRankZero(Callback):
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == SIGNAL_STEP and trainer.global_rank == 0:
            os.kill(os.getpid(), self.signum)


class SignalRankZeroAtTheEnd(Callback):
    def on_train_epoch_end(self, trainer, module):
        if trainer.current_epoch == trainer.max_epochs - 1 and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalRankOneInTest(Callback):
    def on_test_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 1 and trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)


class FailRankOne(Callback):
    def __init__(self, how: str) -> None:
        self.how = how

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step != FAILURE_STEP or trainer.global_rank != 1:
            return
        if self.how == "raise":
            raise RuntimeError(f"injected failure on rank 1 at step {FAILURE_STEP}")
        if self.how == "interrupt":
            os.environ["TORCHELASTIC_ERROR_FILE"] = "/nonexistent-folder/error.json"
            raise KeyboardInterrupt
        if self.how == "exit":
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)


def main(root: str, mode: str) -> None:
    is_failure = mode in ("raise", "exit", "sigkill", "interrupt")
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"), every_n_train_steps=3)
    ]
    if mode in ("SIGTERM", "SIGUSR1"):
        callbacks.append(SignalRankZero(getattr(signal, mode)))
    if mode == "SIGTERM-late":
        callbacks.append(SignalRankZeroAtTheEnd())
    if mode == "SIGTERM-test":
        callbacks.append(SignalRankOneInTest())
    if is_failure:
        callbacks.append(FailRankOne(mode))
    is_distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    torch.manual_seed(0)
    module = Net()
    epochs = 300 if is_failure or mode == "orphan" else 1 if mode == "SIGTERM-test" else 3
    fit = trainer.Trainer(
        max_epochs=epochs, seed=0, accelerator="cpu",
        strategy="ddp" if is_distributed else "auto", callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip
    fit.fit(module, data(), ckpt_path="last" if mode == "resume" else None)
    if mode == "SIGTERM-test":
        fit.test(module, data())
    if fit.is_global_zero:
        weights = {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
        save_file(weights, os.path.join(root, f"final-{mode}.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
