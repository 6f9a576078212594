"""A 2-process DDP job (torchrun, gloo on CPU) with or without background checkpoint saves.

``python async_checkpoint_worker.py ROOT MODE [--sync]``: tests/faults/distributed_job.py's
regression (3 epochs, 6 steps each), ``ModelCheckpoint(every_n_train_steps=2, save_top_k=2, monitor="step", mode="max",
save_last=True)`` into ROOT/checkpoints, ``plugins=[AsyncCheckpointIO()]`` unless ``--sync``.
MODE "full" runs to the end, "first-half" stops after step 7, "resume" continues from "last".
Process 0 writes the final weights to ROOT/final-MODE.safetensors and, per process, what its
ModelCheckpoint tracks to ROOT/rank<R>-MODE.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file

import trainer
from tests.faults.distributed_job import Net, data
from trainer.callbacks import ModelCheckpoint
from trainer.plugins import AsyncCheckpointIO


def main(root: str, mode: str, *flags: str) -> None:
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(root, "checkpoints"),
        every_n_train_steps=2,
        save_top_k=2,
        monitor="step",
        mode="max",
        save_last=True,
    )
    torch.manual_seed(0)
    module = Net()
    fit = trainer.Trainer(
        max_epochs=3, max_steps=7 if mode == "first-half" else -1, seed=0, accelerator="cpu",
        strategy="ddp", callbacks=[checkpoint], logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root,
        plugins=None if "--sync" in flags else [AsyncCheckpointIO()],
    )  # fmt: skip
    fit.fit(module, data(), ckpt_path="last" if mode == "resume" else None)
    tracked = {
        "best_model_path": os.path.basename(checkpoint.best_model_path),
        "last_model_path": os.path.basename(checkpoint.last_model_path),
        "global_step": fit.global_step,
    }
    with open(os.path.join(root, f"rank{fit.global_rank}-{mode}.json"), "w") as file:
        json.dump(tracked, file)
    if fit.is_global_zero:
        weights = {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
        save_file(weights, os.path.join(root, f"final-{mode}.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:])
