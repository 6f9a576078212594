"""find_executable_batch_size: retry a function with a smaller batch after out-of-memory."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from trainer.errors import ConfigurationError

__all__ = ["find_executable_batch_size", "is_out_of_memory"]

T = TypeVar("T")

_OOM_MARKERS = (
    "CUDA out of memory",
    "out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",
    "DefaultCPUAllocator: can't allocate memory",
    "MPS backend out of memory",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory error of any device."""
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _OOM_MARKERS)


def find_executable_batch_size(
    function: Callable[..., T] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[int], int] | None = None,
) -> Any:
    """Decorate ``function(batch_size, ...)`` to retry with half the batch after out-of-memory.

    The decorated function is called without the batch size; it receives it as first argument.

    Examples:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size):
        ...     if batch_size > 16:
        ...         raise torch.OutOfMemoryError("out of memory")
        ...     return batch_size
        >>> train()
        16
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    reduce = reduce_batch_size_fn or (lambda size: size // 2)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        batch_size = starting_batch_size
        while True:
            if batch_size <= 0:
                raise ConfigurationError(
                    f"find_executable_batch_size: {function.__qualname__} ran out of memory down "
                    f"to batch size 1 (started at {starting_batch_size}). Reduce the model or "
                    "sequence size."
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                batch_size = reduce(batch_size)

    return wrapper
