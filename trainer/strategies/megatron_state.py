"""MegatronStrategy's state dicts: tensor-parallel shards as slices of the full tensors.

What this file owns: a module's and an optimizer's state in the forms ``trainer.checkpoint``
writes, where each tensor-parallel shard is a DTensor slice of the full tensor (so DCP writes
one logical tensor, ``trainer checkpoint consolidate`` reassembles it, and a checkpoint loads at
another tensor-parallel size), or full tensors gathered from the peers; loading any of DTensor
shards, local shards or full tensors (sliced to this rank's shard); and the key prefix that
keeps pipeline stages' same-named layers apart.

What it does not own: the groups, mesh and ranks it reads (``megatron_parallel.py``, through a
`ShardLayout`, which MegatronStrategy is), and the checkpoint directory (``trainer.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import torch
import torch.distributed as dist

from trainer.errors import CheckpointError
from trainer.strategies.megatron_parallel import is_tensor_parallel, partition
from trainer.strategies.model_parallel import DATA_PARALLEL, TENSOR_PARALLEL

__all__ = [
    "ShardLayout",
    "load_module_state",
    "load_optimizer_state",
    "module_state",
    "optimizer_state",
]


class ShardLayout(Protocol):
    """The facts of a MegatronStrategy these functions read, each only when needed (ranks and
    the mesh exist after ``setup_environment``)."""

    @property
    def tensor_model_parallel_size(self) -> int: ...

    @property
    def tensor_model_parallel_rank(self) -> int: ...

    @property
    def pipeline_model_parallel_size(self) -> int: ...

    @property
    def pipeline_model_parallel_rank(self) -> int: ...

    @property
    def device_mesh(self) -> Any: ...

    @property
    def parallel_state(self) -> ModuleType: ...


def module_state(inner: torch.nn.Module, layout: ShardLayout, *, full: bool) -> dict[str, Any]:
    """``full``: shards gathered into whole tensors (every rank); else DTensor shards for DCP.

    Megatron layers' ``_extra_state`` entries (always None) are left out.
    """
    params = dict(inner.named_parameters(remove_duplicate=False))
    prefix = "" if full else _stage_prefix(layout)
    state: dict[str, Any] = {}
    for key, value in inner.state_dict().items():
        if value is None:
            continue
        param = params.get(key)
        if param is not None and _is_split(param, layout):
            value = (
                _gather_shards(value, param, layout) if full else _as_dtensor(value, param, layout)
            )
        state[prefix + key] = value
    return state


def load_module_state(
    inner: torch.nn.Module, state_dict: dict[str, Any], layout: ShardLayout, *, strict: bool
) -> None:
    """Load DTensor shards, local shards, or full tensors (sliced to this rank's shard)."""
    params = dict(inner.named_parameters(remove_duplicate=False))
    own = inner.state_dict()
    prefix = _stage_prefix(layout)
    local: dict[str, Any] = {}
    for key, value in state_dict.items():
        if prefix and key.startswith("pipeline_stage_"):
            if not key.startswith(prefix):
                continue  # another stage's layers
            key = key[len(prefix) :]
        if hasattr(value, "to_local"):
            value = value.to_local()
        param, target = params.get(key), own.get(key)
        if param is not None and target is not None and value.shape != target.shape:
            value = _take_shard(value, param, layout)
        local[key] = value
    local.update({k: None for k, v in own.items() if v is None and k not in local})
    inner.load_state_dict(local, strict=strict)


def optimizer_state(
    owner: torch.nn.Module, optimizer: torch.optim.Optimizer, layout: ShardLayout
) -> dict[str, Any]:
    """State keyed by parameter name; states of tensor-parallel parameters as DTensor shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    state = get_optimizer_state_dict(
        owner, optimizer, options=StateDictOptions(full_state_dict=False)
    )
    params = dict(owner.named_parameters())
    for name, entries in list(state["state"].items()):
        param = params.get(name)
        if param is None or not _is_split(param, layout):
            continue
        # A copy of the dict: torch hands back the live optimizer.state entries, which must keep
        # their plain tensors (a DTensor there breaks the next optimizer step).
        entries = state["state"][name] = dict(entries)
        for key, value in entries.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape:
                entries[key] = _as_dtensor(value, param, layout)
    prefix = _stage_prefix(layout)
    return {prefix.rstrip("."): state} if prefix else state


def load_optimizer_state(
    optimizer: torch.optim.Optimizer,
    state_dict: dict[str, Any],
    layout: ShardLayout,
    *,
    owner_of: Callable[[torch.optim.Optimizer], torch.nn.Module],
) -> None:
    """Load name-keyed state (`optimizer_state`'s) or torch's index-keyed state of a dense run.

    ``owner_of`` finds the prepared module owning the optimizer's parameters (name-keyed only).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    prefix = _stage_prefix(layout).rstrip(".")
    state = state_dict.get(prefix, state_dict) if prefix else state_dict
    if not any(isinstance(k, str) for k in state.get("state", {})):
        optimizer.load_state_dict(_shard_index_keyed(optimizer, state, layout))
        return
    state = {
        "state": {
            name: {k: v.to_local() if hasattr(v, "to_local") else v for k, v in entries.items()}
            for name, entries in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }
    set_optimizer_state_dict(
        owner_of(optimizer),
        optimizer,
        state,
        options=StateDictOptions(full_state_dict=False),
    )


def _is_split(param: torch.Tensor, layout: ShardLayout) -> bool:
    """Whether ``param`` is one of several tensor-parallel shards (megatron marks it even at TP=1)."""
    return is_tensor_parallel(param) and layout.tensor_model_parallel_size > 1


def _stage_prefix(layout: ShardLayout) -> str:
    """Pipeline stages hold different layers under the same local names: keep them apart."""
    if layout.pipeline_model_parallel_size == 1:
        return ""
    return f"pipeline_stage_{layout.pipeline_model_parallel_rank}."


def _as_dtensor(local: torch.Tensor, param: torch.Tensor, layout: ShardLayout) -> Any:
    """This rank's shard as a slice of the full tensor (DCP writes and reshards by it)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    dim, stride = partition(param)
    if stride != 1:
        raise CheckpointError(
            f"MegatronStrategy: a parameter of shape {tuple(param.shape)} is split with "
            f"partition_stride={stride}; sharded checkpoints support stride 1 only."
        )
    shape = list(local.shape)
    shape[dim] *= layout.tensor_model_parallel_size
    mesh = layout.device_mesh[DATA_PARALLEL, TENSOR_PARALLEL]
    return DTensor.from_local(
        local,
        mesh,
        [Replicate(), Shard(dim)],
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(shape, device="meta").stride(),
    )


def _gather_shards(local: torch.Tensor, param: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
    """The full tensor: the tensor-parallel peers' shards concatenated."""
    dim, _ = partition(param)
    group = layout.parallel_state.get_tensor_model_parallel_group()
    pieces = [torch.empty_like(local) for _ in range(layout.tensor_model_parallel_size)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def _take_shard(full: torch.Tensor, param: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
    """This rank's slice of a full tensor (a dense or consolidated checkpoint)."""
    if not is_tensor_parallel(param):
        return full  # a shape mismatch: load_state_dict reports it
    dim, _ = partition(param)
    size = layout.tensor_model_parallel_size
    if full.shape[dim] != param.shape[dim] * size:
        return full
    return full.chunk(size, dim=dim)[layout.tensor_model_parallel_rank]


def _shard_index_keyed(
    optimizer: torch.optim.Optimizer, state: dict[str, Any], layout: ShardLayout
) -> dict[str, Any]:
    """torch's index-keyed state of a dense (single-process) run: keep this rank's slices."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sliced = {}
    for index, entries in state.get("state", {}).items():
        param = params[int(index)]
        sliced[index] = {
            key: _take_shard(value, param, layout)
            if isinstance(value, torch.Tensor) and value.shape not in (param.shape, ())
            else value
            for key, value in entries.items()
        }
    return {**state, "state": sliced}
