"""Fits refused at restore, then more work in the same process, in a real 2-process job (#13).

Usage: ``torchrun --standalone --nproc_per_node 2 failed_restore_worker.py OUT STRATEGY FAILS
THEN``. STRATEGY: ``deepspeed``, ``ddp`` or ``fsdp``. The job fits 4 steps and saves a
checkpoint, then runs FAILS fits with ``ckpt_path`` a copy of it with one byte flipped (in turn
rank 0's and rank 1's shard), each refused with a ``CheckpointError`` that the script catches.
THEN is ``exit`` (the script ends there) or ``fit``: one more fit, resuming the good checkpoint
to step 8; then the group is ended, as ``Accelerator.end_training`` does, and a last fit of 2
steps joins a new one.

Each rank writes ``OUT/rank<r>.json``, and at exit, once trainer's exit fallback has ended the
groups, ``OUT/rank<r>_exit.json`` with the gloo threads still running. A group not freed by
then keeps them into interpreter shutdown, where one that frees a just-finished collective's
tensors aborts the process ("terminate called without an active exception": rank 1 did that
after two refused DeepSpeed fits at the end of a script).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import shutil
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader

import trainer
from tests.distributed.ddp_worker import Net, quiet, regression
from tests.distributed.exit_worker import gloo_threads
from tests.distributed.launch import flip_byte
from trainer.checkpoint.manifest import read_manifest


def strategy_of(name: str) -> Any:
    """A fresh strategy named ``name`` (a DeepSpeed one for every fit, as users write it)."""
    if name == "deepspeed":
        from trainer.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=2)
    return name


def fit(name: str, ckpt_path: str | None = None, max_steps: int = 4) -> trainer.Trainer:
    run = quiet(strategy=strategy_of(name), max_steps=max_steps, seed=0)
    loader = DataLoader(regression(32), batch_size=4, shuffle=True)
    run.fit(Net(), loader, ckpt_path=ckpt_path)
    return run


def damaged_copies(good: str, out: str, count: int, rank: int) -> list[tuple[str, str]]:
    """``count`` copies of ``good`` (written by rank 0), each with one byte flipped in a data
    file, taking turns between rank 0's and rank 1's shard (DeepSpeed's ZeRO shards, FSDP's
    DCP files; DDP: the model and the optimizer file); (copy, flipped file) pairs."""
    files = sorted(n for n in read_manifest(good)["files"] if not n.endswith(".json"))
    shards = [[n for n in files if f"zero_pp_rank_{r}_" in n or f"__{r}_0." in n] for r in (0, 1)]
    targets = [min(names) for names in shards] if all(shards) else files[:2]
    copies = []
    for index in range(count):
        name = targets[index % 2]
        copy = os.path.join(out, f"damaged_{index}")
        copies.append((copy, name))
        if rank == 0:
            shutil.copytree(good, copy)
            flip_byte(os.path.join(copy, name), -10)
    return copies


def record_threads_at_exit(path: str) -> None:
    """At exit, after trainer's exit fallback (registered later, so run earlier), write the
    gloo threads still running to ``path``."""

    def record() -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"gloo_threads": gloo_threads()}, file)

    atexit.register(record)


def main(out: str, name: str, fails: int, then: str) -> None:
    rank = int(os.environ["RANK"])
    record_threads_at_exit(os.path.join(out, f"rank{rank}_exit.json"))
    if name == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed  # noqa: F401  (as deepspeed_worker.py: imported, then frozen)

        gc.freeze()
    facts: dict[str, Any] = {"rank": rank}
    first = fit(name)
    good = os.path.join(out, "good")
    first.save_checkpoint(good)
    facts["saved_step"] = first.global_step
    copies = damaged_copies(good, out, fails, rank)
    first.strategy.barrier()  # the copies are complete before any rank reads one
    facts["refusals"] = []
    for copy, damaged in copies:
        try:
            fit(name, ckpt_path=copy)
            facts["refusals"].append([damaged, None])
        except trainer.CheckpointError as err:
            facts["refusals"].append([damaged, str(err)])
    if then == "fit":
        again = fit(name, ckpt_path=good, max_steps=8)
        facts["after_steps"] = again.global_step
        facts["after_weights_finite"] = all(
            bool(torch.isfinite(p).all()) for p in again.module.parameters()
        )
        first.strategy.end_process_group()  # it started the group; as Accelerator.end_training
        facts["after_end_steps"] = fit(name, max_steps=2).global_step
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
