"""A 2-process FSDP2 job (torchrun, gloo on CPU) with or without background sharded saves.

``python async_checkpoint_fsdp_worker.py ROOT MODE [OP N] [--sync] [--slow]``: fsdp_worker's
``Net`` (AdamW, two wrapped blocks) on 64 samples, batch 4 per process (8 steps an epoch), 2
epochs, ``FSDPStrategy(state_dict_type="SHARDED")``, ``ModelCheckpoint(every_n_train_steps=3,
save_top_k=2, monitor="step", mode="max", save_last=True)`` into ROOT/checkpoints, with
``plugins=[AsyncCheckpointIO()]`` unless ``--sync``. ``--slow``: each DCP write in the background
starts 0.3 s late, so training goes on for several steps while a save is in flight. MODE:

- "full": to the end.
- "first-half": stops after step 7 (checkpoints at steps 3 and 6).
- "resume": ``fit(ckpt_path="last")`` to the end.
- "kill": from the save at step 9 on, process 0 SIGKILLs process 1 and then itself at the N-th
  filesystem operation OP ("fsync", "rename") made off the training thread (DCP's upload thread
  or the writer thread): a machine lost in the middle of a background write. N=0 only prints
  those operations (OP, thread, path), one a line.
- "blocked": at step 5 every process saves into ROOT/blocker/ck, where ROOT/blocker is a file
  (a folder that cannot be created).
- "disk-full": at step 9 every process saves into ROOT/checkpoints/full-disk while process 0
  may write no file over 200 bytes (RLIMIT_FSIZE): its shard file cannot be written, process
  1's can.

- "preempt": process 0 gets SIGTERM at step 8; the processes agree on it at step 10, save
  ``preempted-epoch=1-step=10`` and exit with status 0 (with ``--slow``, while the save of step
  9 is still being written).

In "blocked" and "disk-full" the error each process raises goes to ROOT/error-rank<R>.txt.

Each process writes ROOT/rank<R>-MODE.json: what its ModelCheckpoint tracks, the checkpoint
folder's entries right after ``fit`` returned, and the plugin's counters; process 0 writes the
final full weights to ROOT/final-MODE.safetensors.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict_saver as state_dict_saver
from safetensors.torch import save_file
from torch.utils.data import DataLoader

import trainer
from tests.distributed.ddp_worker import regression
from tests.distributed.fsdp_worker import Net
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.errors import CheckpointError
from trainer.plugins import AsyncCheckpointIO
from trainer.strategies import FSDPStrategy

KILL_STEP = 9
SIGNAL_STEP = 8
BLOCKED_STEP = 5
SLOW_S = 0.3


class KillBoth:
    """Counts filesystem operations off the training thread; at the N-th OP, kills both ranks."""

    def __init__(self, root: str, op: str, n: int) -> None:
        self.root, self.op, self.n = root, op, n
        self.count = 0
        self.is_armed = False

    def install(self) -> None:
        for name in ("fsync", "rename"):
            setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, op: str, function):
        def wrapped(*args, **kwargs):
            thread = threading.current_thread().name
            if self.is_armed and thread != "MainThread":
                if self.n == 0:  # trace: where could it be killed
                    print(f"{op}\t{thread}\t{args[0]}", flush=True)
                elif op == self.op:
                    self.count += 1
                    if self.count == self.n:
                        self._kill(thread)
            return function(*args, **kwargs)

        return wrapped

    def _kill(self, thread: str) -> None:
        with open(os.path.join(self.root, "killed-on-thread.txt"), "w") as file:
            file.write(thread)
        with open(os.path.join(self.root, "pid-1")) as file:
            os.kill(int(file.read()), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class Arm(Callback):
    """Before ModelCheckpoint: at KILL_STEP, completes the earlier saves, then arms (rank 0)."""

    def __init__(self, killer: KillBoth | None) -> None:
        self.killer = killer

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.killer is not None and trainer.global_step == KILL_STEP:
            trainer.checkpoint_io.wait()
            self.killer.is_armed = True


class SaveOnFullDisk(Callback):
    """Before ModelCheckpoint: at KILL_STEP, once the earlier saves are complete, saves to
    ROOT/checkpoints/full-disk while process 0 may write no file over 200 bytes (a full disk on
    its machine), until that background write has ended (the limit would also stop the error
    report a failing process writes)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != KILL_STEP:
            return
        trainer.checkpoint_io.wait()
        if trainer.global_rank == 0:
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (200, hard))
        pending = trainer.save_checkpoint(self.path)
        deadline = time.monotonic() + 60
        while not pending.has_ended and time.monotonic() < deadline:
            time.sleep(0.01)
        lift_file_size_limit()


def lift_file_size_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))


class SignalAt(Callback):
    """SIGTERM to process 0 at SIGNAL_STEP, as a scheduler would send it."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == SIGNAL_STEP and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)


class SaveIntoBlocked(Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == BLOCKED_STEP:
            trainer.save_checkpoint(self.path)


def slow_background_writes(steps: list[tuple[int, int]], fit: list[trainer.Trainer]) -> None:
    """Each DCP write on the background thread starts SLOW_S late; notes the steps it spans."""
    save = state_dict_saver.save

    def late(*args, **kwargs):
        if threading.current_thread().name == "MainThread":
            return save(*args, **kwargs)
        begun = fit[0].global_step
        time.sleep(SLOW_S)
        result = save(*args, **kwargs)
        steps.append((begun, fit[0].global_step))
        return result

    state_dict_saver.save = late


def main(root: str, mode: str, *rest: str) -> None:
    flags = {arg for arg in rest if arg.startswith("--")}
    rest = tuple(arg for arg in rest if not arg.startswith("--"))
    rank = int(os.environ["RANK"])
    with open(os.path.join(root, f"pid-{rank}"), "w") as file:
        file.write(str(os.getpid()))
    killer = KillBoth(root, rest[0], int(rest[1])) if mode == "kill" and rank == 0 else None
    folder = os.path.join(root, "checkpoints")
    checkpoint = ModelCheckpoint(
        dirpath=folder, every_n_train_steps=3, save_top_k=2, monitor="step", mode="max",
        save_last=True,
    )  # fmt: skip
    callbacks: list[Callback] = [Arm(killer), checkpoint]
    if mode == "blocked":
        callbacks.insert(0, SaveIntoBlocked(os.path.join(root, "blocker", "ck")))
    if mode == "preempt":
        callbacks.insert(0, SignalAt())
    if mode == "disk-full":
        callbacks.insert(0, SaveOnFullDisk(os.path.join(folder, "full-disk")))
    io = None if "--sync" in flags else AsyncCheckpointIO()
    torch.manual_seed(0)
    module = Net()
    fit = trainer.Trainer(
        max_epochs=2, max_steps=7 if mode == "first-half" else -1, seed=0, accelerator="cpu",
        strategy=FSDPStrategy("cpu", auto_wrap_policy={"Block"}), callbacks=callbacks,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, plugins=[io] if io is not None else None,
    )  # fmt: skip
    spans: list[tuple[int, int]] = []
    if "--slow" in flags:
        slow_background_writes(spans, [fit])
    if killer is not None:
        killer.install()
    loader = DataLoader(regression(64), batch_size=4, shuffle=True)
    try:
        fit.fit(module, loader, ckpt_path="last" if mode == "resume" else None)
    except CheckpointError as err:
        with open(os.path.join(root, f"error-rank{rank}.txt"), "w") as file:
            file.write(str(err))
        raise
    entries = sorted(os.listdir(folder))  # what a reader sees the moment fit returned
    facts = {
        "best_model_path": os.path.basename(checkpoint.best_model_path),
        "last_model_path": os.path.basename(checkpoint.last_model_path),
        "global_step": fit.global_step,
        "entries": entries,
        "spans": spans,
        "save_count": io.save_count if io is not None else 0,
        "total_wait_s": io.total_wait_s if io is not None else 0.0,
    }
    with open(os.path.join(root, f"rank{rank}-{mode}.json"), "w") as file:
        json.dump(facts, file)
    weights = fit.accelerator.get_state_dict(module)  # a collective: every rank gathers
    if rank == 0:
        tensors = {k: v.detach().clone().contiguous() for k, v in weights.items()}
        save_file(tensors, os.path.join(root, f"final-{mode}.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
