"""Started by `trainer launch` (or run directly with TRAINER_TEST_DEVICES set): a Trainer with
strategy "auto" (or "ddp" + devices) fits; each rank writes what it ran as to OUT/rank<r>.json."""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader

import trainer
from tests.distributed.ddp_worker import Net, regression

if __name__ == "__main__":
    out = sys.argv[1]
    devices = int(os.environ.get("TRAINER_TEST_DEVICES", "0"))
    options = {"strategy": "ddp", "devices": devices, "accelerator": "cpu"} if devices else {}
    torch.manual_seed(0)
    fit = trainer.Trainer(
        max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, **options,
    )  # fmt: skip
    fit.fit(Net(), DataLoader(regression(32), batch_size=4))
    facts = {
        "rank": fit.global_rank, "world_size": fit.world_size, "strategy": type(fit.strategy).__name__,
        "mixed_precision": fit.accelerator.mixed_precision, "steps": fit.global_step,
    }  # fmt: skip
    with open(os.path.join(out, f"rank{fit.global_rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
