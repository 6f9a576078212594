"""find_executable_batch_size: retry a function with a smaller batch after out-of-memory;
release_memory and empty_device_cache: give memory back between attempts or runs."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from trainer.errors import ConfigurationError

__all__ = [
    "BatchSizeGivenError",
    "empty_device_cache",
    "find_executable_batch_size",
    "is_out_of_memory",
    "release_memory",
]

T = TypeVar("T")

_OOM_MARKERS = (
    "CUDA out of memory",
    "out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",
    "DefaultCPUAllocator: can't allocate memory",
    "MPS backend out of memory",
)


class BatchSizeGivenError(ConfigurationError, TypeError):
    """A function decorated by `find_executable_batch_size` was called with the batch size,
    which the decorator passes (Accelerate raises ``TypeError``: this is one)."""


def empty_device_cache(collect_garbage: bool = True) -> None:
    """Collect garbage (a full collection: about 0.1 s with torch loaded) and give the CUDA
    caching allocator's free blocks back to the device."""
    if collect_garbage:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Accelerate's ``accelerate.utils.release_memory``: collect garbage, empty the device cache
    and return one None per object given, to rebind them (``model, optimizer =
    release_memory(model, optimizer)``) so nothing here keeps them alive."""
    count = len(objects)
    del objects  # this frame's references; the caller's names go when it rebinds them
    empty_device_cache()
    return [None] * count


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory error of any device."""
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _OOM_MARKERS)


def find_executable_batch_size(
    function: Callable[..., T] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> Any:
    """Decorate ``function(batch_size, ...)`` to retry with a smaller batch after out-of-memory.

    As Accelerate's: the decorated function is called without the batch size and receives it
    as first argument; after an out-of-memory error the batch size becomes ``int(size * 0.9)``,
    or what ``reduce_batch_size_fn()`` returns (Accelerate's form, no argument;
    ``reduce_batch_size_fn(size)`` is accepted too). The size that worked is kept: the next call
    of the decorated function starts from it.

    Raises:
        ConfigurationError: the batch size reached 0.
        BatchSizeGivenError: the caller passed the batch size (the decorator passes it).

    Examples:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size):
        ...     if batch_size > 16:
        ...         raise torch.OutOfMemoryError("out of memory")
        ...     return batch_size
        >>> train()  # 64, 57, 51, 45, 40, 36, 32, 28, 25, 22, 19, then 17 fails, 15 runs
        15
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size
    reduce = _reducer(reduce_batch_size_fn)
    parameters = list(inspect.signature(function).parameters)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        nonlocal batch_size
        if len(parameters) < len(args) + 1:
            given = ", ".join(f"{name}={value!r}" for name, value in zip(parameters[1:], args[1:]))
            raise BatchSizeGivenError(
                f"find_executable_batch_size: {function.__qualname__} was called with the batch "
                f"size as its first argument; the decorator passes it. Call "
                f"{function.__qualname__}({given})."
            )
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
                empty_device_cache()
                batch_size = reduce(batch_size)

    return wrapper


def _reducer(reduce_batch_size_fn: Callable[..., int] | None) -> Callable[[int], int]:
    """The next batch size from the current one: x0.9, or the user's function of none or it."""
    if reduce_batch_size_fn is None:
        return lambda size: int(size * 0.9)
    try:
        takes_size = bool(inspect.signature(reduce_batch_size_fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: Accelerate calls it bare
        takes_size = False
    if takes_size:
        return lambda size: int(reduce_batch_size_fn(size))
    return lambda size: int(reduce_batch_size_fn())
