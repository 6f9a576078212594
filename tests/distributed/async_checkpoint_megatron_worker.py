"""A 2-process MegatronStrategy job (torchrun, gloo on CPU, TP=2) with background checkpoint saves.

``python async_checkpoint_megatron_worker.py ROOT``: megatron_worker's ``MegatronNet``
(ColumnParallelLinear -> tanh -> RowParallelLinear, clipped) with AdamW on 64
samples, batch 4 (16 steps an epoch), 2 epochs, ``ModelCheckpoint(every_n_train_steps=5, save_top_k=2,
monitor="step", mode="max", save_last=True)``, in one launch:

- ROOT/sync: synchronous saves, to the end;
- ROOT/async: ``plugins=[AsyncCheckpointIO()]``, each DCP write on the writer thread starting
  SLOW_S late (the real write after), so training goes on while a save is in flight;
- ROOT/resume: in the background, stopped after step 12, then ``fit(ckpt_path="last")``.

Each run writes ROOT/<run>/rank<R>.json (what its ModelCheckpoint tracks, the folder's entries
right after ``fit`` returned, the plugin's counters, the steps each background write spanned);
process 0 writes the gathered final weights to ROOT/<run>/final.safetensors.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict_saver as state_dict_saver

from tests.distributed.megatron_worker import MegatronNet, gathered, loader, quiet, save_rank0
from trainer.callbacks import ModelCheckpoint
from trainer.plugins import AsyncCheckpointIO

SLOW_S = 0.1


def fit(root: str, name: str, *, is_async: bool, max_steps: int = -1, ckpt_path=None) -> None:
    run_root = os.path.join(root, name)
    os.makedirs(run_root, exist_ok=True)
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(run_root, "checkpoints"), every_n_train_steps=5, save_top_k=2,
        monitor="step", mode="max", save_last=True,
    )  # fmt: skip
    io = AsyncCheckpointIO() if is_async else None
    run = quiet(
        max_epochs=2, max_steps=max_steps, callbacks=[checkpoint], enable_checkpointing=True,
        default_root_dir=run_root, plugins=[io] if io is not None else None,
    )  # fmt: skip
    spans: list[tuple[int, int]] = []
    save = state_dict_saver.save

    def late(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "MainThread":
            return save(*args, **kwargs)
        begun = run.global_step
        time.sleep(SLOW_S)
        result = save(*args, **kwargs)
        spans.append((begun, run.global_step))
        return result

    state_dict_saver.save = late
    torch.manual_seed(0)
    module = MegatronNet()  # AdamW: saves must leave its live tensor-parallel states alone
    try:
        run.fit(module, loader(), ckpt_path=ckpt_path)
    finally:
        state_dict_saver.save = save
    facts = {
        "entries": sorted(os.listdir(checkpoint.dirpath)),  # the moment fit returned
        "best_model_path": os.path.basename(checkpoint.best_model_path),
        "last_model_path": os.path.basename(checkpoint.last_model_path),
        "global_step": run.global_step,
        "spans": spans,
        "save_count": io.save_count if io is not None else 0,
    }
    with open(os.path.join(run_root, f"rank{os.environ['RANK']}.json"), "w") as file:
        json.dump(facts, file)
    save_rank0(run_root, "final.safetensors", gathered(run, module))
    dist.barrier()


def main(root: str) -> None:
    fit(root, "sync", is_async=False)
    fit(root, "async", is_async=True)
    fit(root, "resume", is_async=True, max_steps=12)
    fit(root, "resume", is_async=True, ckpt_path="last")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
