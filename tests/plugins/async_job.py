"""A training job with background checkpoint saves; run as a script by test_async_checkpoint.py.

``python async_job.py ROOT MODE [OP N] [--sync]`` trains tests/faults/kill_job.py's regression
(3 epochs, shuffle, dropout, momentum, a scheduler; 15 steps), checkpointing every 2 steps with
``save_top_k=2`` and ``save_last=True`` into ROOT/checkpoints, with
``plugins=[AsyncCheckpointIO()]`` unless ``--sync``. MODE:

- "full": the uninterrupted run.
- "first-half": stops after step 6 (checkpoints at steps 2, 4 and 6).
- "resume": ``fit(ckpt_path="last")`` to the end; prints the step it started from.
- "kill": from the save at step 8 on, SIGKILLs itself at the N-th filesystem operation OP
  ("open", "fsync", "rename", "rmtree", ...), wherever it happens: the writes run on the
  background thread (and the pool it writes the tensor files with) while training goes on.
  The killing thread's name goes to ROOT/killed-on-thread.txt.
- "preempt": SIGTERM at step 8, while the save of step 8 is still being written (the writer
  waits 1 s before writing): the job must finish that save and its own, then exit with status 0.

Final weights go to ROOT/final-MODE.safetensors.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
from safetensors.torch import save_file

import trainer
import trainer.plugins.async_checkpoint as async_checkpoint
from tests.faults.kill_job import SAVE_STEP, FileOperations, Net, data
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.plugins import AsyncCheckpointIO


class KillOnAnyThread(FileOperations):
    """kill_job's wrapper, also noting which thread the kill came from (in ROOT)."""

    def __init__(self, root: str, op: str | None, n: int) -> None:
        super().__init__(op, n, is_trace=False)
        self.root = root

    def seen(self, op: str, path) -> None:
        if self.is_armed and op == self.op and self.counts.get(op, 0) + 1 == self.n:
            name = threading.current_thread().name  # written with os.open: not wrapped
            fd = os.open(os.path.join(self.root, "killed-on-thread.txt"), os.O_WRONLY | os.O_CREAT)
            os.write(fd, name.encode())
            os.close(fd)
        super().seen(op, path)


class ArmFromSave(Callback):
    """Placed before ModelCheckpoint: arms the wrapper for the save at SAVE_STEP and after.

    The saves before it are completed first (their `last` swap and rotation run on the training
    thread), so the operations counted are the save of SAVE_STEP's, in a fixed order.
    """

    def __init__(self, operations: FileOperations) -> None:
        self.operations = operations

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == SAVE_STEP:
            if trainer.checkpoint_io is not None:
                trainer.checkpoint_io.wait()
            self.operations.is_armed = True


class SignalAtSave(Callback):
    """SIGTERM to this process at SAVE_STEP; the loop acts on it after the batch's hooks."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == SAVE_STEP:
            os.kill(os.getpid(), signal.SIGTERM)


class ReportStart(Callback):
    def on_train_start(self, trainer, module):
        print(f"start step {trainer.global_step}", flush=True)


def slow_writes(seconds: float) -> None:
    """Each background write starts ``seconds`` late (the real writer, real files, after)."""
    write = async_checkpoint.write_checkpoint

    def late(*args, **kwargs):
        time.sleep(seconds)
        return write(*args, **kwargs)

    async_checkpoint.write_checkpoint = late


def main(root: str, mode: str, *rest: str) -> None:
    is_sync = "--sync" in rest
    rest = tuple(arg for arg in rest if arg != "--sync")
    op, n = (rest[0], int(rest[1])) if rest else (None, 0)
    operations = KillOnAnyThread(root, op, n)
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(root, "checkpoints"),
        every_n_train_steps=2,
        save_top_k=2,
        monitor="loss",
        save_last=True,
    )
    callbacks: list[Callback] = [ReportStart(), ArmFromSave(operations), checkpoint]
    if mode == "preempt":
        callbacks.insert(0, SignalAtSave())
        slow_writes(1.0)
    torch.manual_seed(0)
    module = Net()
    fit = trainer.Trainer(
        max_epochs=3, max_steps=6 if mode == "first-half" else -1, seed=0, accelerator="cpu",
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, plugins=None if is_sync else [AsyncCheckpointIO()],
    )  # fmt: skip
    if mode == "kill":
        operations.install()
    fit.fit(module, data(), ckpt_path="last" if mode == "resume" else None)
    weights = {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
    save_file(weights, os.path.join(root, f"final-{mode}.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:])
