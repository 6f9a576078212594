"""Collective operations over nested structures of tensors, built on the Strategy's four verbs.

The Accelerator's ``gather`` / ``gather_for_metrics`` / ``reduce`` / ``pad_across_processes`` /
``broadcast`` live here so the facade stays thin, and so do Accelerate's free functions
(``gather_object``, ``broadcast_object_list``): ``trainer.accelerator.operations`` calls the same
functions with the current process's strategy. With one process each is the identity
(``gather`` of a 0-dim tensor still returns shape ``(1,)``, as the Accelerator's always has).
As in Accelerate, what they reduce or exchange must be tensors: ``reduce`` of a Python number
(``loss.item()``) raises `NotATensorError`, and so do ``gather`` and ``broadcast`` with several
processes, where each process would otherwise keep its own value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.runtime.gradient_state import GradientState
    from trainer.strategies import Strategy

__all__ = [
    "REDUCTIONS",
    "NotATensorError",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_for_metrics",
    "gather_object",
    "map_tensors",
    "number_as_tensor",
    "pad_across_processes",
    "reduce",
]


class NotATensorError(ConfigurationError, TypeError):
    """A collective was given a Python number or another non-tensor (Accelerate: ``TypeError``).

    A `ConfigurationError`, so ``except TrainerError`` catches it, and a ``TypeError`` like the
    one Accelerate raises there; defined beside the collectives, its only user.
    """


def _require_tensors(call: str, data: Any) -> None:
    """Refuse a non-tensor leaf: a collective would hand it back unchanged on every process."""

    def _leaves(value: Any, where: str) -> None:
        if isinstance(value, torch.Tensor):
            return
        if isinstance(value, dict):
            for key, item in value.items():
                _leaves(item, f"{where}[{key!r}]")
            return
        if isinstance(value, list | tuple):
            for index, item in enumerate(value):
                _leaves(item, f"{where}[{index}]")
            return
        found = f" at {where}" if where else ""
        raise NotATensorError(
            f"{call}(tensor={describe(data)}): expected a tensor or a list, tuple or dict of "
            f"tensors; found {describe(value)}{found}. Pass a tensor, e.g. "
            "torch.tensor(loss.item(), device=accelerator.device), or the loss tensor itself; "
            "for Python objects use gather_object."
        )

    _leaves(data, "")


def number_as_tensor(value: Any, device: torch.device | str) -> Any:
    """A Python bool / int / float or a NumPy array as a tensor on ``device`` (Lightning's
    conversion before ``all_gather``: bool as uint8, int as int32, float as float32); any other
    value as it is."""
    if isinstance(value, bool):  # before int: a bool is an int
        return torch.tensor(value, dtype=torch.uint8, device=device)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int, device=device)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float, device=device)
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":
        return torch.from_numpy(value).to(device)
    return value


def map_tensors(
    function: Callable[[torch.Tensor], Any],
    data: Any,
    *,
    numbers: Callable[[Any], Any] | None = None,
) -> Any:
    """Apply ``function`` to every tensor in a nest of dicts, lists, tuples and namedtuples.

    ``numbers``, when given, first turns each other leaf into a tensor (or returns it as is).
    """
    if numbers is not None and not isinstance(data, torch.Tensor | dict | list | tuple):
        data = numbers(data)
    if isinstance(data, torch.Tensor):
        return function(data)
    if isinstance(data, dict):
        return type(data)({k: map_tensors(function, v, numbers=numbers) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(function, v, numbers=numbers) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(map_tensors(function, v, numbers=numbers) for v in data)
    return data


def gather(strategy: Strategy, data: Any) -> Any:
    if strategy.world_size > 1:
        _require_tensors("gather", data)
    return _gather_tensors(strategy, data)


def _gather_tensors(strategy: Strategy, data: Any) -> Any:
    """`gather` without the check: gather_for_metrics leaves non-tensors of a mixed nest as they are."""

    def _gather(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 0:
            tensor = tensor.unsqueeze(0)
        stacked = strategy.all_gather(tensor.contiguous())
        return stacked.reshape(-1, *tensor.shape[1:])

    return map_tensors(_gather, data)


def gather_for_metrics(
    strategy: Strategy, gradient_state: GradientState, data: Any, use_gather_object: bool = False
) -> Any:
    is_objects = use_gather_object or not _has_tensor(data)
    gathered = _gather_objects(strategy, data) if is_objects else _gather_tensors(strategy, data)
    remainder = gradient_state.remainder
    if gradient_state.end_of_dataloader and remainder > 0:
        # The last batch was completed with samples from the start: keep only the real ones,
        # of the one list of objects, or of each tensor however they are nested.
        if is_objects:
            return gathered[:remainder]
        return map_tensors(lambda tensor: tensor[:remainder], gathered)
    return gathered


def _has_tensor(data: Any) -> bool:
    found = False

    def _mark(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal found
        found = True
        return tensor

    map_tensors(_mark, data)
    return found


def _gather_objects(strategy: Strategy, data: Any) -> list[Any]:
    if strategy.world_size == 1:
        return list(data) if isinstance(data, list | tuple) else [data]
    return gather_object(strategy, data)


def gather_object(strategy: Strategy, obj: Any) -> Any:
    """Every process's picklable ``obj``, in rank order: lists and tuples are concatenated into one
    list, any other object is one item per process. One process: ``obj`` itself."""
    if strategy.world_size == 1:
        return obj
    flat: list[Any] = []
    for item in strategy.all_gather_object(obj):
        flat.extend(item if isinstance(item, list | tuple) else [item])
    return flat


def broadcast_object_list(
    strategy: Strategy, object_list: list[Any], from_process: int = 0
) -> list[Any]:
    """Replace the items of ``object_list`` (in place) by those of process ``from_process``."""
    if not isinstance(object_list, list):
        raise ConfigurationError(
            f"broadcast_object_list(object_list={describe(object_list)}): expected a list, which "
            "is filled in place. Pass a list, e.g. [value]."
        )
    if strategy.world_size > 1:
        object_list[:] = strategy.broadcast(list(object_list), src=from_process)
    return object_list


REDUCTIONS = ("sum", "mean", "max", "min", "none")


def reduce(strategy: Strategy, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    if reduction not in REDUCTIONS:
        raise ConfigurationError(
            f"reduce(reduction={reduction!r}): expected one of {REDUCTIONS}. Pass one of them."
        )
    _require_tensors("reduce", data)

    def _reduce(tensor: torch.Tensor) -> torch.Tensor:
        if reduction == "none":
            return tensor
        reduced = strategy.all_reduce(tensor.clone(), op=reduction)
        return reduced * scale if scale != 1.0 else reduced

    return map_tensors(_reduce, data)


def pad_across_processes(
    strategy: Strategy, data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    def _pad(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 0 or dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        max_size = int(strategy.all_gather(size).max())
        if max_size == tensor.shape[dim]:
            return tensor
        new_shape = list(tensor.shape)
        new_shape[dim] = max_size
        padded = tensor.new_full(new_shape, pad_index)
        start = max_size - tensor.shape[dim] if pad_first else 0
        index = [slice(None)] * tensor.ndim
        index[dim] = slice(start, start + tensor.shape[dim])
        padded[tuple(index)] = tensor
        return padded

    return map_tensors(_pad, data)


def broadcast(strategy: Strategy, data: Any, from_process: int = 0) -> Any:
    if strategy.world_size > 1:
        _require_tensors("broadcast", data)
    return map_tensors(lambda tensor: strategy.broadcast(tensor, src=from_process), data)
