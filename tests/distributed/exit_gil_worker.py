"""A DDP wrapper outliving ``end_training`` while a gloo thread still needs the GIL (#13).

Usage: ``torchrun --standalone --nproc_per_node 2 exit_gil_worker.py OUT_DIR``. After
``end_training`` a collective is still running on the ended group — rank 1 joins it 2 s late —
and its completion runs a Python callback in a gloo thread, as torch's own cleanup of a
collective launched during backward does. Then the script lets go of the prepared DDP wrapper.
If that release freed the group, its destructor would wait for the gloo thread with the GIL
held while the thread waits for the GIL: the process would never exit. Each rank writes
``OUT_DIR/rank<r>.json`` when the wrapper is gone; the process must then exit 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from trainer import Accelerator


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model, optimizer = accelerator.prepare(
        torch.nn.Linear(4, 1), torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1)
    )
    accelerator.backward(model(torch.randn(8, 4)).sum())
    group = dist.group.WORLD
    accelerator.end_training()
    if rank == 1:
        time.sleep(2.0)
    work = group.allreduce([torch.ones(1)])
    callbacks = []
    work.get_future().then(lambda future: callbacks.append(future.value()))
    del work, group
    started = time.monotonic()
    del model, optimizer, accelerator  # the DDP wrapper (and its C++ Reducer) goes here
    facts = {"rank": rank, "release_s": time.monotonic() - started}
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    main(sys.argv[1])
