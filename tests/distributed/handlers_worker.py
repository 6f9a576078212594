"""Kwargs handlers inside a real 2-process job (``torchrun --nproc_per_node 2``, gloo on CPU).

Usage: ``torchrun --standalone --nproc_per_node 2 handlers_worker.py OUT_DIR``. An Accelerator
made with ``DistributedDataParallelKwargs``, ``InitProcessGroupKwargs`` and ``ProfileKwargs``
trains a model with an unused head for 3 steps under ``accelerator.profile()``; each rank writes
``OUT_DIR/rank<r>.json`` with what the DDP wrapper and the process group were built with.
``test_accelerator_handlers.py`` checks them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from trainer import (
    Accelerator,
    DistributedDataParallelKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)


class TwoHeads(torch.nn.Module):
    """A body and two heads, one never used: DDP needs ``find_unused_parameters`` for it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.used = torch.nn.Linear(4, 1)
        self.unused = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(torch.tanh(self.body(x)))


def run(out: Path) -> dict[str, object]:
    accelerator = Accelerator(
        cpu=True,
        kwargs_handlers=[
            DistributedDataParallelKwargs(
                find_unused_parameters=True, bucket_cap_mb=1, gradient_as_bucket_view=True,
                comm_hook="fp16",
            ),
            InitProcessGroupKwargs(backend="gloo", timeout=dt.timedelta(seconds=123)),
            ProfileKwargs(output_trace_dir=str(out / "traces"), activities=["cpu"]),
        ],
    )  # fmt: skip
    torch.manual_seed(0)
    model = TwoHeads()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    with accelerator.profile():
        for _ in range(3):
            loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = accelerator.gather(weights.unsqueeze(0))
    facts = {
        "strategy": type(accelerator.strategy).__name__,
        "backend": dist.get_backend(),
        "timeout_s": dist.group.WORLD._get_backend(
            torch.device("cpu")
        ).options._timeout.total_seconds(),
        "find_unused_parameters": model.find_unused_parameters,
        "bucket_bytes_cap": model.bucket_bytes_cap,
        "gradient_as_bucket_view": model.gradient_as_bucket_view,
        "comm_hooks": [getattr(hook, "__name__", repr(hook)) for hook, _ in model._comm_hooks],
        "weights_equal_across_ranks": bool(torch.equal(gathered[0], gathered[1])),
        "ddp_handler": type(accelerator.ddp_handler).__name__,
    }
    accelerator.end_training()
    return facts


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    try:
        facts = run(out)
    except Exception:
        facts = {"error": traceback.format_exc()}
    (out / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
