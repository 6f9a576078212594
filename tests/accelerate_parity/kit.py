"""What every parity scenario builds on: the two sides, the data, the model, JSON facts.

A scenario is a function of a `Side` — Accelerate 1.15's names or trainer's, looked up by name —
that returns JSON facts about what this process saw. The worker runs each registered scenario on
one side and writes the facts; the tests compare Accelerate's facts (the expected value) with
trainer's. A name trainer does not have raises `MissingName` only in the scenarios that use it.
Imported by the worker processes only, so it may import accelerate at the top.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

SCENARIOS: dict[str, Callable[[Side], Any]] = {}

# Where each side's free functions are imported from: Accelerate's own modules, and ``trainer``
# itself (the migration guide's ``from trainer import gather, prepare_data_loader, ...``).
TRAINER_FUNCTION_MODULES = ("trainer",)
ACCELERATE_FUNCTION_MODULES = ("accelerate.utils", "accelerate.data_loader", "accelerate")


class MissingName(AttributeError):
    """The side has no public object of that name."""


def scenario(name: str) -> Callable[[Callable[[Side], Any]], Callable[[Side], Any]]:
    """Register ``function`` under ``name`` (``group/case``)."""

    def register(function: Callable[[Side], Any]) -> Callable[[Side], Any]:
        if name in SCENARIOS:
            raise KeyError(f"scenario {name!r} registered twice")
        SCENARIOS[name] = function
        return function

    return register


@dataclass(frozen=True)
class Side:
    """One framework: ``"accelerate"`` or ``"trainer"``."""

    name: str

    def attr(self, name: str) -> Any:
        """A public class or function: ``accelerate`` / ``accelerate.utils``, or ``trainer``."""
        modules = ("accelerate", "accelerate.utils") if self.name == "accelerate" else ("trainer",)
        for module_name in modules:
            found = getattr(importlib.import_module(module_name), name, None)
            if found is not None:
                return found
        raise MissingName(f"{name} in none of {modules}")

    def function(self, name: str) -> Callable[..., Any]:
        """A free function of ``accelerate.utils`` / ``accelerate.data_loader``, or trainer's mirror."""
        modules = (
            ACCELERATE_FUNCTION_MODULES if self.name == "accelerate" else TRAINER_FUNCTION_MODULES
        )
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if callable(getattr(module, name, None)):
                return getattr(module, name)
        raise MissingName(f"{name} in none of {modules}")

    def accelerator(self, **options: Any) -> Any:
        """A fresh ``Accelerator(cpu=True, **options)``; Accelerate's accumulation state reset."""
        if self.name == "accelerate":
            from accelerate.state import GradientState

            GradientState._reset_state()
        return self.attr("Accelerator")(cpu=True, **options)

    def loader_config(self, **options: Any) -> Any:
        return self.attr("DataLoaderConfiguration")(**options)

    def accumulation_plugin(self, **options: Any) -> Any:
        return self.attr("GradientAccumulationPlugin")(**options)


# ---- data and model -------------------------------------------------------------------------
WEIGHTS = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def dataset(n: int, seed: int = 0) -> TensorDataset:
    """``(x, y, index)`` rows: 4 features, a noisy linear target, the sample's number."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ WEIGHTS + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y, torch.arange(n))


class Stream(IterableDataset):
    """The rows of `dataset` as an iterable dataset with a length."""

    def __init__(self, n: int) -> None:
        self.rows = dataset(n)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        yield from (self.rows[i] for i in range(len(self.rows)))

    def __len__(self) -> int:
        return len(self.rows)


def loader(n: int, batch_size: int | None = 2, **options: Any) -> DataLoader:
    return DataLoader(dataset(n), batch_size=batch_size, **options)


def ids(batch: Any) -> list[int]:
    """The sample numbers of a batch ``(x, y, index)``."""
    return [int(i) for i in batch[2].reshape(-1)]


def model(dropout: float = 0.0) -> torch.nn.Module:
    """A small MLP, initialised from its own seed: building it draws nothing from the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        layers = [torch.nn.Linear(4, 8), torch.nn.Tanh()]
        if dropout:
            layers.append(torch.nn.Dropout(dropout))
        return torch.nn.Sequential(*layers, torch.nn.Linear(8, 1))


def parameters(module: torch.nn.Module) -> list[float]:
    """Every parameter, flattened, in order."""
    return [float(v) for p in module.parameters() for v in p.detach().reshape(-1).cpu()]


def loss_of(module: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y, _ = batch
    return torch.nn.functional.mse_loss(module(x), y)


# ---- facts ----------------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """Tensors as ``{"tensor": values, "dtype", "shape"}``; containers kept (tuples as lists)."""
    if isinstance(value, torch.Tensor):
        return {
            "tensor": value.detach().cpu().tolist(),
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": list(value.shape),
        }
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return f"<{type(value).__name__}>"


def error_fact(error: BaseException) -> dict[str, str]:
    """What a scenario that raised records: the exception's type and the start of its message."""
    return {"error": f"{type(error).__name__}: {str(error)[:300]}"}


def scratch() -> Path:
    """This scenario's own directory, the same path on every process (set by the worker)."""
    path = Path(os.environ["PARITY_SCRATCH"])
    path.mkdir(parents=True, exist_ok=True)
    return path
