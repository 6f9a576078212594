"""Run by torchrun: exact resume of augmenting data pipelines on 2 processes (DDP, gloo, CPU).

Args: output folder. For each scenario of ``SCENARIOS`` (tests/data/augment_job.py's datasets)
every rank trains uninterrupted, then stopped at step 13 and resumed from ``last``, and writes
``rank<N>.json``: per scenario, the resumed steps whose batch differs from the uninterrupted
run's, whether the final weights are equal, the samples this rank's resumed run consumed and the
samples produced, and the first batch it saw (the ranks must see different data); for an
Accelerator loop with ``use_stateful_dataloader``, whether ``load_state`` continues each rank's
loader where it stood; the same facts for two train loaders read together; and how many times
the rank forked itself (none: its loaders' workers come from a forkserver, see ``START``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import traceback
import warnings
from pathlib import Path

import torch

from tests.data.augment_job import differing_steps, differing_weights, make_loader, run
from trainer import Accelerator, DataLoaderConfiguration

# name: (dataset kind, num_workers, persistent_workers, torchdata StatefulDataLoader)
SCENARIOS = {
    "map_workers": ("map", 2, False, False),
    "map_persistent": ("map", 2, True, False),
    "stream_main": ("stream", 0, False, False),
    "map_stateful": ("map", 2, False, True),
}
# Workers start from a forkserver, not by forking this process: it runs gloo's threads (and
# autograd's), which enter Python, and on CPython 3.11.7 (python/cpython#112275) a fork while
# another thread holds the runtime's lock can deadlock the child before it runs, leaving the
# loader waiting for that worker for ever (seen about once in 9 runs of this job). The forkserver
# (one per rank, started by exec, single-threaded) imports torch, trainer and the datasets once;
# each worker forked from it starts in milliseconds. Python 3.11's forkserver never preloads
# ``__main__`` although that is its default (it looks for a "main_path" key that the preparation
# data names "init_main_from_path"), so the modules are named here: without them every worker
# imported torch and trainer itself, and this job took 7 minutes instead of about 1.
START = "forkserver"
PRELOAD = ["tests.data.augment_job", "torchdata.stateful_dataloader"]
# 40 samples, batch 4 per process: 5 steps an epoch; step 13 is inside the third epoch.
OPTIONS = dict(strategy="ddp", max_epochs=4)


def scenario(out: Path, kind: str, workers: int, persistent: bool, stateful: bool) -> dict:
    def loader():
        return make_loader(
            kind, num_workers=workers, persistent_workers=persistent, stateful=stateful,
            multiprocessing_context=START,
        )  # fmt: skip

    full, full_weights = run(out / "full", loader(), **OPTIONS)
    run(out / "resumed", loader(), stop_at=13, **OPTIONS)
    resumed_loader = loader()
    resumed, resumed_weights = run(out / "resumed", resumed_loader, ckpt_path="last", **OPTIONS)
    return {
        "resumed_steps": sorted(resumed),
        "differing_steps": differing_steps(full, resumed),
        "weights_equal": not differing_weights(full_weights, resumed_weights),
        "consumed": sum(len(x) for x in resumed.values()),
        "produced": resumed_loader.dataset.produced.value,
        "first_batch": full[1].tolist(),
    }


def combined_scenario(out: Path) -> dict:
    """Two shuffled map-style loaders read together ("max_size_cycle"): 5 and 2 batches an
    epoch per rank, so at step 13 (the third epoch's third batch) the short one is in its second
    pass."""

    def loaders():
        return {
            "long": make_loader("map", num_workers=2, multiprocessing_context=START),
            "short": make_loader("map", batch_size=12),
        }

    full, full_weights = run(out / "full", loaders(), **OPTIONS)
    run(out / "resumed", loaders(), stop_at=13, **OPTIONS)
    resumed, resumed_weights = run(out / "resumed", loaders(), ckpt_path="last", **OPTIONS)
    return {
        "resumed_steps": sorted(resumed),
        "differing_steps": differing_steps(full, resumed),
        "weights_equal": not differing_weights(full_weights, resumed_weights),
        "first_batch": full[1].tolist(),
        "batch_sizes": sorted({len(x) for x in full.values()}),
    }


def accelerator_scenario(out: Path) -> dict:
    """A hand-written loop with ``use_stateful_dataloader``: save after 2 of 5 batches, load in
    a fresh Accelerator: the remaining 3 batches again, and only those are read."""
    config = DataLoaderConfiguration(use_stateful_dataloader=True)

    def prepared():
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        torch.manual_seed(0)
        return accelerator, accelerator.prepare(
            make_loader("map", num_workers=2, multiprocessing_context=START)
        )

    accelerator, loader = prepared()
    batches = iter(loader)
    for _ in range(2):
        next(batches)
    accelerator.save_state(out / "accelerator_state")
    rest = [x for x, _ in batches]
    accelerator, loader = prepared()
    accelerator.load_state(out / "accelerator_state")
    again = [x for x, _ in loader]
    return {
        "batches_equal": len(again) == len(rest) == 3
        and all(torch.equal(a, b) for a, b in zip(again, rest, strict=True)),
        "produced": loader.dataset.produced.value,
    }


def main(out: Path) -> None:
    warnings.filterwarnings("ignore")
    rank = int(os.environ["RANK"])
    multiprocessing.set_forkserver_preload(PRELOAD)
    forks: list[int] = []
    os.register_at_fork(before=lambda: forks.append(1))  # os.fork in this process, not exec'd
    facts = {name: scenario(out / name, *spec) for name, spec in SCENARIOS.items()}
    facts["accelerator"] = accelerator_scenario(out)
    facts["combined"] = combined_scenario(out / "combined")
    facts["forks"] = len(forks)
    (out / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        raise
