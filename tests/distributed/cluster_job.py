"""The job of the simulated-cluster tests (tests/distributed/test_clusters.py, tests/faults/).

``python cluster_job.py ROOT MODE`` under ``trainer launch`` (torchrun) or an srun-like launch
(SLURM variables, one task per rank). Every run calls ``fit(..., ckpt_path="last")``, as a job
script on a cluster does, so a restarted or requeued run resumes by itself. Final weights go to
``ROOT/final-<CLUSTER_TAG or MODE>.safetensors`` (global rank 0).

MODE:

- "full": train to the end.
- "parity": DDP, then FSDP, each on the launched processes; weights ``final-<tag>-ddp`` and
  ``final-<tag>-fsdp``.
- "signal-launcher": at step 7 rank 0 sends ``$CLUSTER_SIGNAL`` to its parent (the launcher).
- "signal-shell": at step 7 rank 0 sends ``$CLUSTER_SIGNAL`` to its launcher's parent (a batch
  shell).
- "signal-self": at step 7 every rank sends ``$CLUSTER_SIGNAL`` to itself (``--signal`` to every
  task).

The signals come on a job's first run only: a run SLURM requeued (``SLURM_RESTART_COUNT`` > 0)
trains to the end.
- "kill-once": on the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0) rank 1 SIGKILLs itself at
  step 8.
- "raise": rank 1 raises at step 5 (the time to ``ROOT/failed_at``), with an
  ``OnExceptionCheckpoint``; the others train on.
- "slow": train for a long time (for a test that kills a machine).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from trainer.strategies import FSDPStrategy

SIGNAL_STEP = 7


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Net(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.out = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.out(self.blocks(self.inp(x))), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.8)]


def data(n: int = 96) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


class Inject(Callback):
    """Signals, kills or raises at a step, as the mode says."""

    def __init__(self, mode: str, root: str) -> None:
        self.mode = mode
        self.root = root
        self.signum = getattr(signal, os.environ.get("CLUSTER_SIGNAL", "SIGTERM"))

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        rank, step = trainer.global_rank, trainer.global_step
        if self.mode == "raise" and rank == 1 and step == 5:
            with open(os.path.join(self.root, "failed_at"), "w") as stamp:
                stamp.write(repr(time.time()))  # when the failure happened, for the test's clock
            raise RuntimeError("injected failure on rank 1 at step 5")
        if self.mode == "kill-once" and rank == 1 and step == 8:
            if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != SIGNAL_STEP or os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
            return
        if self.mode == "signal-self":
            os.kill(os.getpid(), self.signum)
        elif self.mode == "signal-launcher" and trainer.global_rank == 0:
            os.kill(os.getppid(), self.signum)
        elif self.mode == "signal-shell" and trainer.global_rank == 0:
            os.kill(parent_of(os.getppid()), self.signum)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def train(root: str, mode: str, strategy: object, tag: str) -> None:
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"), every_n_train_steps=3),
        Inject(mode, root),
    ]
    if mode == "raise":
        callbacks.append(OnExceptionCheckpoint(os.path.join(root, "on_exception")))
    torch.manual_seed(0)
    module = Net()
    fit = trainer.Trainer(
        max_epochs=400 if mode in ("raise", "slow") else 3, seed=0, accelerator="cpu",
        strategy=strategy, callbacks=callbacks, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip
    fit.fit(module, data(), ckpt_path="last")
    weights = {k: v.detach().clone().contiguous() for k, v in fit.accelerator.get_state_dict(module).items()}  # fmt: skip
    if fit.is_global_zero:
        save_file(weights, os.path.join(root, f"final-{tag}.safetensors"))


def main(root: str, mode: str) -> None:
    tag = os.environ.get("CLUSTER_TAG", mode)
    if mode == "parity":
        train(os.path.join(root, f"{tag}-ddp"), "full", "ddp", f"{tag}-ddp")
        train(os.path.join(root, f"{tag}-fsdp"), "full", FSDPStrategy("cpu", auto_wrap_policy={"Block"}), f"{tag}-fsdp")  # fmt: skip
    else:
        train(root, mode, "ddp", tag)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
