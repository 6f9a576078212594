"""Run every parity scenario on one framework and write this process's facts as JSON.

    python worker.py accelerate|trainer OUT_DIR [SCENARIO_PREFIX ...]
    python -m torch.distributed.run --standalone --nproc_per_node 2 worker.py trainer OUT_DIR

Writes ``OUT_DIR/rank<r>.json``: ``{scenario: facts}``, facts ``{"error": ...}`` when the
scenario raised. Every scenario starts from the same seeds. With several processes the gloo group
is created here with a short timeout, so a collective one side misses fails instead of hanging
(both frameworks join a group that already exists).
"""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from tests.accelerate_parity import (  # noqa: F401  (registers the scenarios)
    scenarios_api,
    scenarios_data,
    scenarios_ops,
    scenarios_training,
)
from tests.accelerate_parity.kit import SCENARIOS, Side, error_fact

GROUP_TIMEOUT = datetime.timedelta(seconds=30)


def _reseed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _in_step(count: int) -> bool:
    """Whether every process has run as many scenarios (a missed collective breaks the group)."""
    try:
        counts = [
            torch.zeros(1, dtype=torch.int64) for _ in range(torch.distributed.get_world_size())
        ]
        torch.distributed.all_gather(counts, torch.tensor([count]))
    except RuntimeError:
        return False
    return all(int(c) == count for c in counts)


def main(argv: list[str]) -> int:
    framework, out = argv[0], Path(argv[1])
    prefixes = argv[2:]
    side = Side(framework)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("gloo", timeout=GROUP_TIMEOUT)
    torch.set_num_threads(1)
    facts: dict[str, object] = {}
    timings: dict[str, float] = {}
    for name, function in SCENARIOS.items():
        if prefixes and not any(name.startswith(p) for p in prefixes):
            continue
        os.environ["PARITY_SCRATCH"] = str(out / "scratch" / name.replace("/", "-"))
        _reseed()
        start = time.perf_counter()
        try:
            facts[name] = function(side)
        except Exception as error:  # recorded, compared, and shown by the test that reads it
            facts[name] = error_fact(error)
            print(f"[{framework} rank {rank}] {name}: {traceback.format_exc()}", file=sys.stderr)
        timings[name] = round(time.perf_counter() - start, 3)
        if world > 1 and not _in_step(len(facts)):
            facts["_aborted"] = f"the processes disagree after {name}: later scenarios not run"
            break
    out.mkdir(parents=True, exist_ok=True)
    payload = {"facts": facts, "seconds": timings}
    (out / f"rank{rank}.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    if world > 1 and "_aborted" not in facts:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
