"""megatron.core's process groups for one job, and the collectives MegatronStrategy runs on them.

What this file owns: checking a layout against what megatron.core can run and the job's number
of processes, importing ``megatron.core.parallel_state`` (MissingDependencyError naming the
extra), (re)initialising its groups for a (tensor, pipeline, virtual pipeline) layout, the
(pipeline, data, tensor) ``DeviceMesh`` whose coordinates must be megatron's ranks, seeding
megatron's CUDA RNG tracker, the marks megatron puts on split parameters, and the gradient and
parameter collectives over its groups: replicated parameters broadcast from tensor-parallel
rank 0, sequence-parallel gradients summed, and the model-wide gradient norm for clipping.

What it does not own: when these run and with which sizes (``megatron.py``), state dicts and
checkpoints (``megatron_state.py``), and the process group itself (``model_parallel.py``).
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from trainer.errors import ConfigurationError, StrategyError
from trainer.strategies.group_lifetime import release_mesh_with_groups, release_with_groups
from trainer.strategies.model_parallel import DATA_PARALLEL, TENSOR_PARALLEL

__all__ = [
    "PIPELINE_PARALLEL",
    "all_reduce_sequence_parallel_grads",
    "broadcast_replicated_parameters",
    "build_device_mesh",
    "check_divides",
    "check_features",
    "check_precision",
    "clip_grad_norm_model_parallel",
    "import_parallel_state",
    "initialize_parallel_state",
    "is_tensor_parallel",
    "partition",
    "seed_rng_tracker",
]

PIPELINE_PARALLEL = "pipeline_parallel"
_MESHES: dict[tuple[str, int, int, int], Any] = {}  # one mesh per layout and process


def check_features(
    *, tensor: int, pipeline: int, sequence_parallel: bool, accelerator_type: str
) -> None:
    """Reject combinations megatron.core cannot run, naming the argument to change.

    Raises:
        ConfigurationError: sequence parallelism without tensor parallelism, or sequence or
            pipeline parallelism off CUDA.
    """
    if sequence_parallel and tensor == 1:
        raise ConfigurationError(
            "MegatronStrategy(sequence_parallel=True) splits activations between "
            "tensor-parallel peers: set tensor_model_parallel_size >= 2, or sequence_parallel=False."
        )
    if accelerator_type == "cuda":
        return
    for argument, is_used in (
        ("sequence_parallel=True", sequence_parallel),
        (f"pipeline_model_parallel_size={pipeline}", pipeline > 1),
    ):
        if is_used:
            raise ConfigurationError(
                f"MegatronStrategy({argument}) needs CUDA: megatron.core runs it with CUDA "
                f"streams and GPU buffers (accelerator={accelerator_type!r}). Use "
                "accelerator='cuda', or tensor parallelism alone on CPU."
            )


def check_divides(world_size: int, *, tensor: int, pipeline: int) -> None:
    """The model-parallel size (tensor x pipeline) must divide the job's processes.

    Raises:
        ConfigurationError: it does not, with the sizes and the number of processes.
    """
    model_parallel = tensor * pipeline
    if world_size % model_parallel:
        raise ConfigurationError(
            f"MegatronStrategy(tensor_model_parallel_size={tensor}, "
            f"pipeline_model_parallel_size={pipeline}): their product "
            f"{model_parallel} does not divide the {world_size} processes of this job. "
            f"Launch a multiple of {model_parallel} processes or choose smaller sizes."
        )


def check_precision(precision_name: str, accelerator_type: str) -> None:
    """Mixed precisions need a GPU under megatron-core's tensor-parallel layers.

    Their backward passes are registered for CUDA's autocast only, so on the CPU the first
    backward would meet a bf16 gradient and a float32 weight deep inside megatron-core.

    Raises:
        ConfigurationError: a mixed precision on the CPU, naming the precisions that work there.
    """
    if accelerator_type == "cpu" and precision_name.endswith("-mixed"):
        raise ConfigurationError(
            f"MegatronStrategy: precision={precision_name!r} does not run on the CPU: "
            "megatron-core's tensor-parallel layers run their backward outside CPU autocast, so "
            "bf16 gradients would meet float32 weights. Use precision='bf16-true' or '32-true' "
            f"on the CPU; {precision_name!r} runs on a GPU."
        )


def import_parallel_state() -> ModuleType:
    """``megatron.core.parallel_state``, or MissingDependencyError naming the extra."""
    from trainer._imports import require

    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
        require("megatron.core", extra="megatron", feature="MegatronStrategy")
    from megatron.core import parallel_state

    return parallel_state


def initialize_parallel_state(
    ps: ModuleType,
    *,
    tensor: int,
    pipeline: int,
    virtual: int | None,
    timeout: dt.timedelta,
    accelerator_type: str,
) -> None:
    """(Re)initialise megatron's groups; an earlier strategy's equal layout is reused."""
    wanted = (tensor, pipeline, virtual)
    if ps.model_parallel_is_initialized():
        current = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_virtual_pipeline_model_parallel_world_size(),
        )
        if current == wanted:
            return
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tensor,
        pipeline_model_parallel_size=pipeline,
        virtual_pipeline_model_parallel_size=virtual,
        distributed_timeout_minutes=max(1, int(timeout.total_seconds() // 60)),
        create_gloo_process_groups=accelerator_type == "cuda",
    )


def build_device_mesh(
    ps: ModuleType, device_type: str, shape: tuple[int, int, int], global_rank: int
) -> Any:
    """The (pp, dp, tp) DeviceMesh of ``shape`` whose coordinates are megatron's ranks.

    Raises:
        StrategyError: megatron-core places this rank elsewhere (DTensor shards would be
            misplaced).
    """
    from torch.distributed.device_mesh import init_device_mesh

    key = (device_type, *shape)
    if key not in _MESHES:
        _MESHES[key] = release_mesh_with_groups(
            init_device_mesh(
                device_type,
                shape,
                mesh_dim_names=(PIPELINE_PARALLEL, DATA_PARALLEL, TENSOR_PARALLEL),
            )
        )
        release_with_groups(_MESHES.clear)  # a later group gets a mesh of its own
    mesh = _MESHES[key]
    coordinates = tuple(mesh.get_local_rank(name) for name in mesh.mesh_dim_names)
    expected = (
        ps.get_pipeline_model_parallel_rank(),
        ps.get_data_parallel_rank(),
        ps.get_tensor_model_parallel_rank(),
    )
    if coordinates != expected:  # megatron changed its rank order: shards would be misplaced
        raise StrategyError(
            f"MegatronStrategy: the device mesh puts rank {global_rank} at (pp, dp, tp) = "
            f"{coordinates} but megatron.core at {expected}. This megatron-core version orders "
            "ranks differently; pin megatron-core to a tested version (see docs/strategies/megatron.md)."
        )
    return mesh


def seed_rng_tracker(seed: int) -> None:
    """Megatron's CUDA RNG tracker: one stream per tensor-parallel rank (dropout in TP regions)."""
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(int(seed) % (2**63 - 3000))


def is_tensor_parallel(param: torch.Tensor) -> bool:
    """Megatron marks split parameters with ``tensor_model_parallel=True``."""
    return bool(getattr(param, "tensor_model_parallel", False))


def partition(param: torch.Tensor) -> tuple[int, int]:
    """(dimension, stride) along which megatron split ``param``."""
    return int(getattr(param, "partition_dim", 0)), int(getattr(param, "partition_stride", 1))


@torch.no_grad()
def broadcast_replicated_parameters(module: torch.nn.Module, ps: ModuleType) -> None:
    """Parameters every tensor-parallel peer holds whole (biases of row-parallel layers, norms)
    start equal on all peers: tensor-parallel rank 0's values."""
    group = ps.get_tensor_model_parallel_group()
    source = ps.get_tensor_model_parallel_src_rank()
    for param in module.parameters():
        if not is_tensor_parallel(param):
            dist.broadcast(param.data, src=source, group=group)


def all_reduce_sequence_parallel_grads(modules: Iterable[torch.nn.Module], group: Any) -> None:
    """Norm weights see only this peer's part of the sequence: their gradients are partial."""
    grads = [
        p.grad
        for module in modules
        for p in module.parameters()
        if p.grad is not None and getattr(p, "sequence_parallel", False)
    ]
    if not grads:
        return
    flat = torch.cat([grad.reshape(-1) for grad in grads])  # one collective for all
    dist.all_reduce(flat, group=group)
    for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        grad.copy_(part.view_as(grad))


def clip_grad_norm_model_parallel(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float,
    *,
    is_first_peer: bool,
    group: Any,
    device: torch.device,
) -> torch.Tensor:
    """Clip by the norm of the whole model: TP shards all count, replicas count once.

    As megatron's ``clip_grad_norm_fp32``: each rank adds the shards it owns (replicated
    parameters only where ``is_first_peer``, tensor-parallel rank 0), summed over ``group``, the
    model-parallel group. Returns the total norm.
    """
    params = [p for p in parameters if p.grad is not None]
    owned = [p.grad for p in params if is_tensor_parallel(p) or is_first_peer]
    if math.isinf(norm_type):
        local = max((g.detach().abs().max().float() for g in owned), default=None)
        total = (local if local is not None else torch.tensor(0.0)).to(device).reshape(1)
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
    else:
        total = torch.zeros(1, device=device)
        for grad in owned:
            total += grad.detach().float().norm(norm_type).pow(norm_type).to(device)
        dist.all_reduce(total, group=group)
        total = total.pow(1.0 / norm_type)
    coefficient = max_norm / (float(total) + 1e-6)
    if coefficient < 1.0:
        for param in params:
            param.grad.mul_(coefficient)  # type: ignore[union-attr]  # filtered above
    return total.reshape(())
