"""ModelParallelStrategy: PyTorch-native tensor parallelism composed with FSDP2 on a 2-D mesh.

Owns: the 2-D device mesh ``("data_parallel", "tensor_parallel")`` built in ``setup_environment``
(so ``configure_model`` can apply a tensor-parallel plan with
``torch.distributed.tensor.parallel.parallelize_module`` on ``device_mesh["tensor_parallel"]``),
``fully_shard`` over the data-parallel sub-mesh in ``setup_module`` (torchtitan's order: the
user's TP plan first, then FSDP), data sharding across data-parallel ranks only, reductions over
the right group, and gradient clipping over parameters that live on different meshes.
Checkpoints are FSDPStrategy's: DCP shards inside the atomic directory (or gathered safetensors
with ``save_distributed_checkpoint=False``).

Not owned: the tensor-parallel plan itself (the user's ``configure_model``), and the layers.
Other layouts (HSDP, context parallel: Accelerate's ``ParallelismConfig``) come in through a
`MeshLayout`, which builds the mesh and names the sub-meshes this strategy uses.

It also holds the small helpers that every model-parallel engine shares (MegatronStrategy imports
them): data-parallel collectives, a one-process group when no launcher started the job, and
argument checks.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from trainer.errors import ConfigurationError, StrategyError, describe
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.ddp import REDUCE_OPS, on_backend_device
from trainer.strategies.environment import ClusterEnvironment
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.group_lifetime import release_mesh_with_groups
from trainer.strategies.strategy import ReduceOp

__all__ = ["MeshLayout", "ModelParallelStrategy", "ParallelMeshes"]

DATA_PARALLEL = "data_parallel"
TENSOR_PARALLEL = "tensor_parallel"


@dataclass(frozen=True)
class ParallelMeshes:
    """The device mesh of a job and the sub-meshes the strategy works on.

    ``fully_shard`` is 1-D for FSDP or 2-D ``(replicate, shard)`` for HSDP; ``data_parallel``
    is every rank that reads different batches; ``context_parallel`` (None when unused) is the
    group that splits each sequence.
    """

    device_mesh: Any
    data_parallel: Any
    tensor_parallel: Any
    fully_shard: Any
    context_parallel: Any = None


class MeshLayout(Protocol):
    """Builds the meshes of a `ModelParallelStrategy` (``trainer.ParallelismConfig`` is one)."""

    def build_meshes(self, device_type: str, world_size: int) -> ParallelMeshes:
        """The meshes for ``world_size`` processes; ConfigurationError if they cannot run."""
        ...


class ModelParallelStrategy(FSDPStrategy):
    """Tensor parallelism (DTensor) inside each data-parallel replica, FSDP2 across replicas.

    The ``world_size`` processes form a ``data_parallel_size x tensor_parallel_size`` mesh;
    tensor-parallel peers are neighbouring ranks (rank = dp_rank * tp_size + tp_rank), so a
    tensor-parallel group stays on one machine when ``tensor_parallel_size`` divides the
    processes per machine.

    Args:
        accelerator: "cpu", "cuda" or None (CUDA when available).
        precision: the Precision plugin; a mixed mode becomes FSDP's MixedPrecisionPolicy.
        data_parallel_size: replicas that each see different data; "auto" is the number of
            machines, or ``world_size // tensor_parallel_size`` when that one is given.
        tensor_parallel_size: processes that split each layer; "auto" is the processes per
            machine, or ``world_size // data_parallel_size`` when that one is given.
        save_distributed_checkpoint: True writes DCP shards from every rank (consolidate with
            ``trainer checkpoint consolidate``); False gathers full weights to rank 0.
        auto_wrap_policy: as in FSDPStrategy, applied over the data-parallel sub-mesh.
        reshard_after_forward: as in FSDPStrategy, applied over the data-parallel sub-mesh.
        activation_checkpointing: as in FSDPStrategy.
        process_group_backend: "nccl", "gloo" or None (nccl on CUDA, gloo on CPU).
        timeout: the collective timeout.
        mesh_layout: builds another mesh than ``(data_parallel, tensor_parallel)`` (HSDP,
            context parallel); the two sizes must then stay "auto".

    Raises:
        ConfigurationError: a size that is not a positive int or "auto"; sizes whose product
            is not the number of processes (raised in ``setup_environment``).

    Examples:
        >>> # 4 processes: 2 replicas, each layer split over 2 processes
        >>> ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)
    """

    name = "model_parallel"

    def __init__(
        self,
        accelerator: str | None = None,
        *,
        precision: Precision | None = None,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
        auto_wrap_policy: set[type[torch.nn.Module] | str] | str | None = None,
        reshard_after_forward: bool | None = None,
        activation_checkpointing: bool | set[type[torch.nn.Module] | str] | None = None,
        process_group_backend: str | None = None,
        timeout: dt.timedelta = dt.timedelta(minutes=30),
        environment: ClusterEnvironment | None = None,
        mesh_layout: MeshLayout | None = None,
    ) -> None:
        super().__init__(
            accelerator,
            precision=precision,
            reshard_after_forward=reshard_after_forward,
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing=activation_checkpointing,
            state_dict_type="SHARDED" if save_distributed_checkpoint else "FULL",
            fsdp_config={},  # an FSDP launch config in the environment is not for this engine
            timeout=timeout,
            environment=environment,
        )
        self._requested_sizes = (
            check_size("ModelParallelStrategy", "data_parallel_size", data_parallel_size, True),
            check_size("ModelParallelStrategy", "tensor_parallel_size", tensor_parallel_size, True),
        )
        if mesh_layout is not None and self._requested_sizes != ("auto", "auto"):
            raise ConfigurationError(
                f"ModelParallelStrategy(mesh_layout={type(mesh_layout).__name__}(...), "
                f"data_parallel_size={data_parallel_size!r}, tensor_parallel_size="
                f"{tensor_parallel_size!r}): the layout sets the sizes; leave both 'auto'."
            )
        self.save_distributed_checkpoint = save_distributed_checkpoint
        self.process_group_backend = process_group_backend
        self.mesh_layout = mesh_layout
        self._meshes: ParallelMeshes | None = None

    # ---- facts -------------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:  # type: ignore[override]
        return DistributedType.FSDP

    @property
    def meshes(self) -> ParallelMeshes:
        """The device mesh and its sub-meshes (data parallel, tensor parallel, FSDP's).

        Raises:
            StrategyError: before ``setup_environment`` (the Trainer/Accelerator runs it).
        """
        if self._meshes is None:
            raise StrategyError(
                "ModelParallelStrategy.device_mesh is built by setup_environment(); create the "
                "Trainer or Accelerator with this strategy first (configure_model runs after)."
            )
        return self._meshes

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh``: dims ``("data_parallel", "tensor_parallel")``, or the layout's.

        Raises:
            StrategyError: before ``setup_environment`` (the Trainer/Accelerator runs it).
        """
        return self.meshes.device_mesh

    @property
    def data_parallel_size(self) -> int:
        return self.meshes.data_parallel.size()

    @property
    def tensor_parallel_size(self) -> int:
        return self.meshes.tensor_parallel.size()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Shard data across data-parallel replicas only: tensor-parallel peers share batches."""
        dp_mesh = self.meshes.data_parallel
        return {"num_replicas": dp_mesh.size(), "rank": dp_mesh.get_local_rank()}

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Join (or start) the process group, then build the mesh (2-D, or the layout's)."""
        self._start_or_join_process_group()
        if self.mesh_layout is not None:
            self._meshes = self.mesh_layout.build_meshes(self.root_device.type, self.world_size)
        else:
            self._meshes = self._build_2d_meshes()
        self._mesh = self._meshes.fully_shard  # fully_shard shards over this one

    def _build_2d_meshes(self) -> ParallelMeshes:
        from torch.distributed.device_mesh import init_device_mesh

        dp, tp = self._resolve_sizes()
        mesh = release_mesh_with_groups(
            init_device_mesh(
                self.root_device.type, (dp, tp), mesh_dim_names=(DATA_PARALLEL, TENSOR_PARALLEL)
            )
        )
        # A flattened (dp, tp) view lets DTensor reduce a norm over both dims in one collective
        # (torchtitan does the same); without it torch warns and runs two.
        # DeviceMesh has no public way to flatten dims.
        mesh[DATA_PARALLEL, TENSOR_PARALLEL]._flatten(f"{DATA_PARALLEL}_{TENSOR_PARALLEL}")  # noqa: SLF001
        dp_mesh = mesh[DATA_PARALLEL]
        return ParallelMeshes(mesh, dp_mesh, mesh[TENSOR_PARALLEL], fully_shard=dp_mesh)

    def _resolve_sizes(self) -> tuple[int, int]:
        """Lightning's "auto": TP within a machine, DP across machines; check the product."""
        world = self.world_size
        dp, tp = self._requested_sizes
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world)) or world
        if dp == "auto" and tp == "auto":
            dp, tp = max(1, world // per_node), per_node
        elif dp == "auto":
            dp = world // int(tp)
        elif tp == "auto":
            tp = world // int(dp)
        if int(dp) * int(tp) != world:
            raise ConfigurationError(
                f"ModelParallelStrategy(data_parallel_size={self._requested_sizes[0]!r}, "
                f"tensor_parallel_size={self._requested_sizes[1]!r}): {dp} x {tp} processes "
                f"do not match the {world} processes of this job. Choose sizes whose product "
                f"is {world}, or leave one as 'auto'."
            )
        return int(dp), int(tp)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Shard the (tensor-parallel) module with FSDP2 over the data-parallel sub-mesh."""
        if self.tensor_parallel_size > 1 and not any(
            hasattr(p, "device_mesh") for p in module.parameters()
        ):
            warnings.warn(
                f"ModelParallelStrategy: tensor_parallel_size={self.tensor_parallel_size} but no "
                "parameter is a DTensor, so every tensor-parallel peer computes the whole model. "
                "Apply a plan in configure_model: parallelize_module(self, "
                "trainer.strategy.device_mesh['tensor_parallel'], {...}).",
                stacklevel=2,
            )
        return super().setup_module(module)

    # ---- training ----------------------------------------------------------------------
    def clip_grad_norm_(
        self,
        module: torch.nn.Module | None,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Clip over parameters on different meshes (2-D TP+FSDP ones, 1-D FSDP-only ones)."""
        return clip_grad_norm_over_meshes(parameters, max_norm, norm_type)

    # ---- collectives -------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        group = self.meshes.data_parallel.get_group()
        return all_reduce_data_parallel(tensor, op, group, self.root_device)

    def all_gather(
        self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> torch.Tensor:
        """One row per data-parallel rank. A ``group`` or ``sync_grads`` (Lightning's
        arguments) gathers as the base strategy does over that group."""
        if group is not None or sync_grads:
            return super().all_gather(tensor, group, sync_grads)
        group = self.meshes.data_parallel.get_group()
        return all_gather_data_parallel(tensor, group, self.root_device)

    def __repr__(self) -> str:
        sizes = (
            f"data_parallel_size={self.data_parallel_size}, tensor_parallel_size={self.tensor_parallel_size}"
            if self._meshes is not None
            else f"data_parallel_size={self._requested_sizes[0]!r}, tensor_parallel_size={self._requested_sizes[1]!r}"
        )
        return f"ModelParallelStrategy(device={self.root_device}, {sizes}, precision={self.precision.name!r})"


# ---- helpers shared by the model-parallel engines ------------------------------------------
def check_size(owner: str, argument: str, value: Any, allow_auto: bool = False) -> int | str:
    """A parallel size: an int >= 1 (or "auto" where allowed), else ConfigurationError."""
    if allow_auto and value == "auto":
        return "auto"
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        expected = "an int >= 1 or 'auto'" if allow_auto else "an int >= 1"
        raise ConfigurationError(
            f"{owner}({argument}={describe(value)}): expected {expected}, e.g. {argument}=2."
        )
    return value


def _check_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise StrategyError(f"all_reduce(op={op!r}): expected one of {sorted(REDUCE_OPS)}.")


def all_reduce_data_parallel(
    tensor: torch.Tensor, op: str, group: Any, device: torch.device
) -> torch.Tensor:
    """ "sum"/"mean" over the data-parallel ``group``; "max"/"min" over every process.

    Model-parallel peers hold replicas of a logged value (the loss after the last all-reduce),
    so summing over all processes would count each sample ``tp`` times; data reductions use the
    data-parallel group. "max"/"min" give the same answer either way for replicas, and over
    every process they make control flags (stop, preempted) agree on all ranks. A host tensor
    goes through ``device`` where the backend is NCCL (it sends CUDA tensors only) and comes back.
    """
    _check_op(op)
    result = tensor.clone() if tensor.is_floating_point() or op != "mean" else tensor.float()
    chosen = None if op in ("max", "min") else group
    sent = on_backend_device(result, device)
    dist.all_reduce(sent, op=REDUCE_OPS[op], group=chosen)
    result = sent.to(tensor.device)
    return result / dist.get_world_size(group) if op == "mean" else result


def all_gather_data_parallel(
    tensor: torch.Tensor, group: Any, device: torch.device
) -> torch.Tensor:
    """Stack ``tensor`` from each data-parallel rank: shape ``(data_parallel_size, ...)``."""
    sent = on_backend_device(tensor.contiguous(), device)
    pieces = [torch.empty_like(sent) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, sent, group=group)
    return torch.stack(pieces).to(tensor.device)


def clip_grad_norm_over_meshes(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """``clip_grad_norm_`` for DTensor gradients on several meshes (and plain ones).

    ``torch.nn.utils.clip_grad_norm_`` stacks per-parameter norms, which fails when a TP+FSDP
    parameter (2-D mesh) and an FSDP-only one (1-D mesh) meet. Here each mesh's norm is made
    whole first (``full_tensor``), then the norms are combined as plain tensors.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    groups: dict[Any, list[torch.Tensor]] = {}  # DeviceMesh (hashable, compared by layout)
    for grad in grads:
        groups.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    norms = []
    for members in groups.values():
        norm = torch.nn.utils.get_total_norm(members, norm_type)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        norms.append(norm.float().cpu())
    stacked = torch.stack(norms)
    total = (
        stacked.max() if math.isinf(norm_type) else stacked.pow(norm_type).sum() ** (1 / norm_type)
    )
    coefficient = min(1.0, max_norm / (float(total) + 1e-6))
    if coefficient < 1.0:
        for members in groups.values():
            torch._foreach_mul_(members, coefficient)
    return total
