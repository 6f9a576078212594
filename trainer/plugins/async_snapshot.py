"""The copy of a checkpoint that a background save writes: every tensor copied to host memory.

Owns `snapshot_checkpoint` (the copy: CPU tensors copied once, CUDA tensors into pinned memory
with asynchronous copies, tied tensors copied once, an earlier copy's buffers reused) and the
`Snapshot` it returns. Writing it, and when, is ``async_checkpoint.py``'s.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from trainer.checkpoint.codec import encode

__all__ = ["Snapshot", "snapshot_checkpoint"]


@dataclasses.dataclass
class Snapshot:
    """A checkpoint copied to host memory, as the writer thread writes it.

    Attributes:
        checkpoint: the copy (same structure; every tensor a host tensor of its own).
        events: CUDA events recorded after the device-to-host copies (none on CPU); the writer
            synchronizes on them before reading.
        buffers: the host tensors allocated for it, reused by the next snapshot once written.
    """

    checkpoint: dict[str, Any]
    events: list[Any]
    buffers: list[torch.Tensor]


def snapshot_checkpoint(
    checkpoint: dict[str, Any], *, spare: list[torch.Tensor] | None = None
) -> Snapshot:
    """A copy of ``checkpoint`` that later training cannot change.

    Dicts, lists and tuples are rebuilt; every tensor is copied to host memory (one copy per
    distinct tensor, so tied weights stay tied); numpy values are copied; numbers, strings and
    bytes are immutable. CUDA tensors go to pinned memory with asynchronous copies, awaited by
    the writer through the returned events. Host tensors of the same shape and dtype in
    ``spare`` (an earlier snapshot's, already written) are filled instead of allocating: fresh
    memory costs page faults, several times the copy itself.

    Raises:
        CheckpointError: a value cannot be stored in a checkpoint (the message gives its path).
    """
    pool: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for buffer in spare or []:
        pool.setdefault((tuple(buffer.shape), buffer.dtype), []).append(buffer)
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    devices: set[torch.device] = set()

    def copied(value: Any, path: str) -> Any:
        if value is None or isinstance(value, bool | int | float | str | bytes):
            return value
        if isinstance(value, torch.Tensor):
            return _copy_tensor(value, copies, pool, devices)
        if isinstance(value, dict):
            return {key: copied(item, f"{path}.{key}") for key, item in value.items()}
        if isinstance(value, list):
            return [copied(item, f"{path}.{i}") for i, item in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(copied(item, f"{path}.{i}") for i, item in enumerate(value))
        if type(value).__module__ == "numpy":
            return copy.deepcopy(value)
        encode(value, {}, path)  # raises the format's own error for a value it cannot store
        return value

    result = {key: copied(value, str(key)) for key, value in checkpoint.items()}
    events = []
    for device in devices:  # after every copy was queued on the device's current stream
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return Snapshot(result, events, list(copies.values()))


def _copy_tensor(
    tensor: torch.Tensor,
    copies: dict[tuple[Any, ...], torch.Tensor],
    pool: dict[tuple[Any, ...], list[torch.Tensor]],
    devices: set[torch.device],
) -> torch.Tensor:
    """A host copy of ``tensor``; the same copy for another entry that is the same view."""
    if tensor.device.type == "meta":
        return tensor.detach()  # no data: the writer reports it as it would synchronously
    view = _view_of(tensor)  # before detach: an XLA entry is told by the object itself
    tensor = tensor.detach()
    if view in copies and tensor.numel() > 0:
        return copies[view]
    is_cuda = tensor.device.type == "cuda"
    # Any host buffer will do: pinned or not, the copy is correct (pinned ones are faster).
    reusable = pool.get((tuple(tensor.shape), tensor.dtype))
    host = (
        reusable.pop()
        if reusable
        else torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=is_cuda)
    )
    host.copy_(tensor, non_blocking=is_cuda)
    if is_cuda:
        devices.add(tensor.device)
    copies[view] = host
    return host


def _view_of(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What tells two entries that are the same data: the storage, offset, shape and strides;
    on a device whose storage has no address (XLA), the tensor object itself."""
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except RuntimeError:  # "invalid python storage": tied entries are the same Parameter there
        return (id(tensor),)
    return (
        tensor.device,
        pointer,
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )
