"""Per-batch cost of seeded fetching (exact resume of augmenting data) against the plain loader.

A prepared loader with a seed (every Trainer loader; an Accelerator's with
``use_seedable_sampler`` or several processes) fetches each batch with torch's, numpy's and
``random``'s generators seeded from the batch's place, and in the main process swaps the
training's generator states out and back around each fetch (``trainer/data/seeding.py``). This
script measures what that costs per batch, in one process, against the same DataLoader read
directly. The variants, interleaved in a rotated order each round so machine drift hits all:

- ``plain``: ``for batch in DataLoader(...)``.
- ``shard``: the same loader through ``DataLoaderShard`` without a seed (read-ahead, no seeding).
- ``seeded``: ``DataLoaderShard`` with a seed: seeded fetches (what the Trainer uses).
- ``stateful`` (with torchdata): ``seeded`` over a ``StatefulDataLoader``, whose state is also
  taken after every batch (``state_dict()``), against a plain ``StatefulDataLoader`` read directly.

Datasets: ``tiny`` returns one row of a tensor (no work: the worst case for any per-batch cost);
``augment`` returns a 3x32x32 image plus noise drawn from torch, numpy and ``random`` (a small
vision augmentation). Batch 32, ``num_workers`` 0 (fetches in the main process) and 2, one
thread. The report gives, for the wall clock and for this process's CPU time (with workers, the
main process's share only; on a busy machine the steadier figure), the median microseconds per
batch and the median of the per-round ratios to ``plain`` (``stateful``: to the plain
StatefulDataLoader).

Run: ``python -m benchmarks.bench_data_seeding --batches 200 --rounds 5 --json seeding.json``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainer.data import DataLoaderShard

BATCH_SIZE = 32
CLOCKS = ("wall", "cpu")  # cpu: this process only (workers' time not counted)


class Tiny(Dataset):
    """One row of a tensor per sample: nothing to do, so the loader's own cost shows."""

    def __init__(self, n: int) -> None:
        self.data = torch.randn(n, 8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


class Augment(Dataset):
    """A 3x32x32 image plus noise from torch, numpy and ``random`` at every read."""

    def __init__(self, n: int) -> None:
        self.images = torch.randn(n, 3, 32, 32)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = 0.1 * torch.randn(3, 32, 32) + float(np.random.rand()) + random.random()
        return self.images[index] + noise


def _loader(dataset: Dataset, workers: int, *, stateful: bool = False) -> DataLoader:
    loader_class = DataLoader
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as loader_class
    return loader_class(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(0),
    )


def _shard(loader: DataLoader, seed: int | None) -> DataLoaderShard:
    shard = DataLoaderShard(loader)
    shard.seed = seed
    return shard


def _time_epoch(loader: Iterable[Any]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) for one pass."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in loader:
        pass
    return time.perf_counter() - wall, time.process_time() - cpu


def _variants(dataset: Dataset, workers: int, with_stateful: bool) -> dict[str, Iterable[Any]]:
    """Each variant's iterable, built once: persistent workers start in the warm-up epoch."""
    variants: dict[str, Iterable[Any]] = {
        "plain": _loader(dataset, workers),
        "shard": _shard(_loader(dataset, workers), None),
        "seeded": _shard(_loader(dataset, workers), 0),
    }
    if with_stateful:
        variants["stateful_plain"] = _loader(dataset, workers, stateful=True)
        variants["stateful"] = _shard(_loader(dataset, workers, stateful=True), 0)
    return variants


def measure(
    make_dataset: Callable[[int], Dataset], workers: int, *, batches: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Per variant, per clock: median microseconds per batch and median ratio to the baseline."""
    try:
        import torchdata.stateful_dataloader  # noqa: F401
    except ImportError:
        with_stateful = False
    else:
        with_stateful = True
    variants = _variants(make_dataset(batches * BATCH_SIZE), workers, with_stateful)
    for loader in variants.values():  # warm-up: workers start, imports, allocator
        _time_epoch(loader)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            wall, cpu = _time_epoch(variants[name])
            times[name].append((wall / batches, cpu / batches))
    baseline = {name: "stateful_plain" if name == "stateful" else "plain" for name in names}
    figures: dict[str, dict[str, float]] = {}
    for name in names:
        figures[name] = {}
        for index, clock in enumerate(CLOCKS):
            own = [t[index] for t in times[name]]
            base = [t[index] for t in times[baseline[name]]]
            figures[name][f"{clock}_us_per_batch"] = statistics.median(own) * 1e6
            figures[name][f"{clock}_ratio"] = statistics.median(
                o / b for o, b in zip(own, base, strict=True)
            )
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="batches per epoch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results: dict[str, Any] = {
        "config": {"batches": args.batches, "rounds": args.rounds, "batch_size": BATCH_SIZE}
    }
    print(
        "| dataset | workers | variant | wall us/batch | ratio | main-process CPU us/batch | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for dataset_name, make_dataset in (("tiny", Tiny), ("augment", Augment)):
        for workers in args.workers:
            figures = measure(make_dataset, workers, batches=args.batches, rounds=args.rounds)
            results[f"{dataset_name}_w{workers}"] = figures
            for variant, f in figures.items():
                print(
                    f"| {dataset_name} | {workers} | {variant} | {f['wall_us_per_batch']:.1f} | "
                    f"{f['wall_ratio']:.3f} | {f['cpu_us_per_batch']:.1f} | {f['cpu_ratio']:.3f} |"
                )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
