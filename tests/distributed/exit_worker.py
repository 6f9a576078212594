"""Inside a real 2-process job: the process group ends inside each stage's teardown, not at exit.

Usage: ``torchrun --standalone --nproc_per_node 2 exit_worker.py OUT_DIR``. Each rank writes
``OUT_DIR/rank<r>.json`` with whether a process group was open after each step of the script,
and which gloo threads were still running once it had ended (none: the group was freed).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from tests.distributed.ddp_worker import Net, quiet, regression
from trainer import Accelerator


def gloo_threads() -> list[str]:
    """Names of this process's gloo threads (a freed process group leaves none)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as file:
            names.append(file.read().strip())
    return sorted(name for name in names if "gloo" in name)


if __name__ == "__main__":
    out = sys.argv[1]
    facts: dict[str, object] = {}
    torch.manual_seed(0)
    first, second = quiet(max_epochs=1, seed=0), quiet(max_epochs=1, seed=0)  # both built up front
    facts["open_before_fit"] = dist.is_initialized()
    module = Net()
    first.fit(module, DataLoader(regression(32), batch_size=4))
    facts["open_after_fit"] = dist.is_initialized()
    facts["gloo_threads_after_fit"] = gloo_threads()
    facts["steps"] = first.global_step
    first.save_checkpoint(os.path.join(out, "after_fit"))  # collectives join the group again
    facts["validate"] = first.validate(module, DataLoader(regression(16), batch_size=4))
    facts["open_after_validate"] = dist.is_initialized()
    second.fit(Net(), DataLoader(regression(32), batch_size=4))  # the other Trainer's own group
    facts["second_steps"] = second.global_step
    facts["open_after_second_fit"] = dist.is_initialized()
    accelerator = Accelerator(cpu=True)
    facts["accelerator_sum"] = accelerator.reduce(torch.tensor([1.0]), "sum").tolist()
    accelerator.end_training()
    facts["open_after_end_training"] = dist.is_initialized()
    facts["gloo_threads_at_end"] = gloo_threads()
    facts["rank"] = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{facts['rank']}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
