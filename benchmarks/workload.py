"""The per-step workload every overhead benchmark times: model, data, clocks, one run's readings.

Owns what `bench_overhead`, `bench_loggers` and `frameworks` share so that every variant, trainer's
or another framework's, does the same math on the same data: a 2,762-parameter MLP
(64→32→16→8→2, ReLU) built with seed 0, ``steps`` batches of 32 synthetic samples (seed 0) read
by ``DataLoader(batch_size=32, shuffle=False)``, plain SGD (lr 0.05). It does not run or report
anything.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

__all__ = [
    "BATCH_SIZE",
    "CLOCKS",
    "RunTimes",
    "build_dataset",
    "build_loader",
    "build_net",
    "build_optimizer",
    "flat_params",
    "output_to",
    "read_clocks",
    "run_accelerator_loop",
]

BATCH_SIZE = 32
IN_FEATURES = 64
LAYER_SIZES = (IN_FEATURES, 32, 16, 8, 2)
LEARNING_RATE = 0.05
SEED = 0
CLOCKS = ("wall", "cpu")


def read_clocks() -> tuple[float, float]:
    """``(perf_counter, process_time)``: wall seconds, and CPU seconds of this process.

    On a shared machine the wall clock also counts time the process waited for a core; CPU
    time does not, so it shows the framework's own cost even when the machine is busy.
    """
    return time.perf_counter(), time.process_time()


@dataclass
class RunTimes:
    """Clock readings of one variant in one round, and its parameters afterwards."""

    start: tuple[float, float]
    loop_start: tuple[float, float]
    loop_end: tuple[float, float]
    end: tuple[float, float]
    params: torch.Tensor

    def total_s(self, clock: int) -> float:
        return self.end[clock] - self.start[clock]

    def loop_s(self, clock: int) -> float:
        return self.loop_end[clock] - self.loop_start[clock]


def build_net() -> torch.nn.Sequential:
    """The MLP, seeded so every variant starts from the same weights."""
    torch.manual_seed(SEED)
    layers: list[torch.nn.Module] = []
    for index, (n_in, n_out) in enumerate(itertools.pairwise(LAYER_SIZES)):
        layers.append(torch.nn.Linear(n_in, n_out))
        if index < len(LAYER_SIZES) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def build_optimizer(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LEARNING_RATE)


def build_dataset(steps: int) -> TensorDataset:
    """``steps`` batches of synthetic inputs and two-class labels (fixed seed)."""
    generator = torch.Generator().manual_seed(SEED)
    count = steps * BATCH_SIZE
    x = torch.randn(count, IN_FEATURES, generator=generator)
    y = torch.randint(0, LAYER_SIZES[-1], (count,), generator=generator)
    return TensorDataset(x, y)


def build_loader(dataset: TensorDataset) -> DataLoader:
    return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=False)


def run_accelerator_loop(accelerator_class: Any, dataset: TensorDataset) -> RunTimes:
    """The hand-written loop on ``accelerator_class(cpu=True)``: trainer's and Hugging Face's
    Accelerator run these same lines, so only the class differs between their figures."""
    net, loader = build_net(), build_loader(dataset)
    start = read_clocks()
    accelerator = accelerator_class(cpu=True)
    model, optimizer, prepared = accelerator.prepare(net, build_optimizer(net.parameters()), loader)
    loop_start = read_clocks()
    for x, y in prepared:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    end = read_clocks()
    return RunTimes(start, loop_start, end, end, flat_params(net))


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


@contextlib.contextmanager
def output_to(path: str | None) -> Iterator[None]:
    """Send stdout and stderr (progress bars, summaries) to ``path`` during a run; None: leave them.

    Lightning's bar writes to stderr and trainer's to stdout: both go to the same place, so
    every framework pays for drawing its bar on a stream that is not a terminal, as in CI.
    """
    if path is None:
        yield
        return
    with (
        open(path, "w", encoding="utf-8") as sink,
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
    ):
        yield
