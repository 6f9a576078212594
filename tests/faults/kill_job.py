"""A training job for the fault matrix; run as a script by tests/faults/test_kill_during_save.py.

``python kill_job.py ROOT MODE [OP N]`` trains 3 epochs of a small regression on CPU (shuffle,
dropout, momentum, a scheduler), checkpointing every 2 steps with ``save_top_k=2`` and
``save_last=True`` into ROOT/checkpoints. MODE:

- "full": the uninterrupted run.
- "trace": like "full", but prints the filesystem operations of the save at step 8, one per line
  (``op<TAB>path``), so the test can choose where to kill.
- "kill": SIGKILLs itself at the N-th filesystem operation OP ("open", "fsync", "rename",
  "replace", "rmtree", "unlink", "symlink") of the save at step 8 — a real ``kill -9`` at a
  precise point of the save; N=0 kills right after that save returns.
- "first-half": stops after step 6 (checkpoints at steps 2, 4 and 6).
- "resume": ``fit(ckpt_path="last")`` to the end.

Final weights go to ROOT/final-MODE.safetensors.
"""

from __future__ import annotations

import builtins
import os
import shutil
import signal
import sys
import threading
from typing import Any

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

import trainer
from tests.checkpoint.resume_job import Net  # the same model as the resume tests
from trainer.callbacks import Callback, ModelCheckpoint

SAVE_STEP = 8


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)


class FileOperations:
    """Wraps the filesystem calls a save makes; reports or kills at the N-th one of a kind."""

    def __init__(self, op: str | None, n: int, *, is_trace: bool) -> None:
        self.op, self.n, self.is_trace = op, n, is_trace
        self.counts: dict[str, int] = {}
        self.is_armed = False
        # The checkpoint writer writes a save's files on several threads: one line, one write,
        # and the count and its kill decided together (interleaved prints split lines and made
        # the traced operation list differ from run to run).
        self._lock = threading.Lock()

    def seen(self, op: str, path: Any) -> None:
        if not self.is_armed:
            return
        with self._lock:
            if self.is_trace:
                sys.stdout.write(f"{op}\t{path}\n")
                sys.stdout.flush()
            self.counts[op] = self.counts.get(op, 0) + 1
            if op == self.op and self.counts[op] == self.n:
                os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        wrap = self._wrap
        os.fsync = wrap("fsync", os.fsync)
        os.rename = wrap("rename", os.rename)
        os.replace = wrap("replace", os.replace)
        os.unlink = wrap("unlink", os.unlink)
        os.symlink = wrap("symlink", os.symlink)
        shutil.rmtree = wrap("rmtree", shutil.rmtree)
        real_open = builtins.open

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if any(flag in mode for flag in "wax+"):
                self.seen("open", file)
            return real_open(file, mode, *args, **kwargs)

        builtins.open = open_

    def _wrap(self, op: str, function: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.seen(op, args[0] if args else "")
            return function(*args, **kwargs)

        return wrapped


class ArmAtSave(Callback):
    """Placed before ModelCheckpoint: arms the wrapper for the save that follows at SAVE_STEP."""

    def __init__(self, operations: FileOperations) -> None:
        self.operations = operations

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.operations.is_armed = trainer.global_step == SAVE_STEP


class KillAfterSave(Callback):
    """Placed after ModelCheckpoint: SIGKILL right after the save at SAVE_STEP returned."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == SAVE_STEP:
            os.kill(os.getpid(), signal.SIGKILL)


def main(root: str, mode: str, op: str | None = None, n: int = 0) -> None:
    operations = FileOperations(op, n, is_trace=mode == "trace")
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(root, "checkpoints"),
        every_n_train_steps=2,
        save_top_k=2,
        monitor="loss",
        save_last=True,
    )
    callbacks: list[Callback] = [ArmAtSave(operations), checkpoint]
    if mode == "kill" and n == 0:
        callbacks.append(KillAfterSave())
    torch.manual_seed(0)
    module = Net()
    fit = trainer.Trainer(
        max_epochs=3, max_steps=6 if mode == "first-half" else -1, seed=0, accelerator="cpu",
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root,
    )  # fmt: skip
    if mode in ("trace", "kill"):
        operations.install()
    fit.fit(module, data(), ckpt_path="last" if mode == "resume" else None)
    weights = {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
    save_file(weights, os.path.join(root, f"final-{mode}.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(sys.argv[3:4]), *(int(a) for a in sys.argv[4:5]))
