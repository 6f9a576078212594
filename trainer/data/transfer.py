"""Moving a nested batch to a device: `send_to_device`, Accelerate's ``accelerate.utils`` function.

One implementation for every mover: the prepared loader's batches, the Trainer's
``transfer_batch_to_device`` default, the big-model hooks' inputs and outputs, and users' own
code (``from trainer import send_to_device``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["send_to_device"]


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: str | list[str] | None = None,
) -> Any:
    """``tensor`` with every tensor inside moved to ``device``, the structure kept.

    Goes through tuples, lists, named tuples and mappings (rebuilt as their own type, or a
    ``dict`` where that type cannot be built from one); anything else with a ``.to`` method
    (transformers' ``BatchEncoding``, a module) is moved with it; other values are returned as
    they are.

    Args:
        tensor: the data: a tensor or a nested structure holding tensors.
        device: where the tensors go.
        non_blocking: asynchronous copies where the device supports them (CUDA from pinned memory).
        skip_keys: a key or keys of the mappings inside whose values stay where they are.
    """
    if isinstance(tensor, torch.Tensor):
        return tensor.to(device, non_blocking=non_blocking)
    if isinstance(tensor, tuple) and hasattr(tensor, "_fields"):  # a named tuple
        return type(tensor)(*(send_to_device(v, device, non_blocking, skip_keys) for v in tensor))
    if isinstance(tensor, list | tuple):
        return type(tensor)(send_to_device(v, device, non_blocking, skip_keys) for v in tensor)
    to = getattr(tensor, "to", None)
    if callable(to):  # before Mapping: a BatchEncoding moves itself and keeps its encodings
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() without non_blocking
            return to(device)
    if isinstance(tensor, Mapping):
        skipped = (skip_keys,) if isinstance(skip_keys, str) else tuple(skip_keys or ())
        moved = {
            k: v if k in skipped else send_to_device(v, device, non_blocking, skip_keys)
            for k, v in tensor.items()
        }
        try:
            return type(tensor)(moved)
        except TypeError:  # e.g. a defaultdict, whose constructor wants its factory first
            return moved
    return tensor
