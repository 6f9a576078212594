"""A script whose Trainer is a module-level variable, as most training scripts are (#13).

Usage: ``torchrun --standalone --nproc_per_node 2 group_lifetime_worker.py OUT STRATEGY``,
STRATEGY ``fsdp``, ``deepspeed`` or ``ddp``. The script fits 4 steps with ``run`` a global, and
ends. The Trainer ends its group when the fit ends, but ``run`` still holds what runs on it (the
FSDP module's mesh, the DeepSpeed engine and its ZeRO optimizer), so the group stays alive into
interpreter shutdown, where freeing it can abort the process ("terminate called without an
active exception").

At exit, after trainer's exit fallback (registered later, so run earlier), each rank writes
``OUT/rank<r>_exit.json``: how many of the groups it saw during the fit are still alive, whether
the fallback keeps each of them for ever (so none is freed during finalization), and the gloo
threads still running.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

import trainer
from tests.distributed.ddp_worker import Net, quiet, regression
from tests.distributed.exit_worker import gloo_threads
from trainer.callbacks import Callback
from trainer.strategies import group_lifetime

OUT, NAME = sys.argv[1], sys.argv[2]
GROUPS: list[weakref.ref[Any]] = []  # every group the fit ran on, weakly


class SeeGroups(Callback):
    def on_train_end(self, run: trainer.Trainer, module: trainer.TrainModule) -> None:
        GROUPS.extend(weakref.ref(group) for group in dist.distributed_c10d._world.pg_map)


def record_at_exit() -> None:
    alive = [group for group in (ref() for ref in GROUPS) if group is not None]
    facts = {
        "seen": len(GROUPS),
        "alive": len(alive),
        "kept": all(any(group is kept for kept in group_lifetime._ENDED_GROUPS) for group in alive),
        "gloo_threads": gloo_threads(),
    }
    del alive
    with open(
        os.path.join(OUT, f"rank{os.environ['RANK']}_exit.json"), "w", encoding="utf-8"
    ) as file:
        json.dump(facts, file)


atexit.register(record_at_exit)
if NAME == "deepspeed":
    from trainer.strategies import DeepSpeedStrategy

    strategy: Any = DeepSpeedStrategy(stage=2)
else:
    strategy = NAME
run = quiet(strategy=strategy, max_steps=4, seed=0, callbacks=[SeeGroups()])
run.fit(Net(), DataLoader(regression(32), batch_size=4, shuffle=True))
