"""``ParallelismConfig``: Accelerate's n-D parallelism sizes, turned into a strategy and a mesh.

Owns the sizes (``dp_replicate_size`` x ``dp_shard_size`` x ``cp_size`` x ``tp_size``), their
checks, the ``DeviceMesh`` they describe (Accelerate's dim names, plus the flattened ``dp``,
``dp_shard_cp`` and ``dp_cp``), the choice of the existing strategy that runs them
(`strategy_for_parallelism`) and the context-parallel context (`maybe_context_parallel`).

Does not own any engine: pure replication is ``DDPStrategy``; sharding, tensor and context
parallelism are ``ModelParallelStrategy`` (FSDP2 over the ``dp_shard_cp`` mesh, or HSDP over
``(dp_replicate, dp_shard_cp)``), which receives this config as its ``MeshLayout``. The
tensor-parallel plan is the user's, applied on ``strategy.device_mesh["tp"]`` before
``prepare`` (as Accelerate applies a transformers model's ``tp_plan``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe
from trainer.strategies import Strategy
from trainer.strategies.environment import detect_environment
from trainer.strategies.model_parallel import ParallelMeshes

__all__ = ["ParallelismConfig", "maybe_context_parallel", "strategy_for_parallelism"]

# Accelerate's canonical order: data-parallel dims outermost, tensor parallel innermost, so
# tensor-parallel peers are neighbouring ranks (on one machine).
MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")
_SIZE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")
_CP_COMM_STRATEGIES = ("allgather", "alltoall")


@dataclass
class ParallelismConfig:
    """How the processes of a job split the work: Accelerate's ``ParallelismConfig``.

    The product of the sizes is the number of processes. ``dp_shard_size > 1`` alone is FSDP;
    with ``dp_replicate_size > 1`` it is HSDP (each shard group holds one replica, replicas
    all-reduce); ``dp_replicate_size`` alone is DDP; ``tp_size`` splits each layer
    (``parallelize_module`` on ``device_mesh["tp"]``); ``cp_size`` splits each sequence
    (CUDA only: torch has no context-parallel CPU attention). Sizes left None read
    ``PARALLELISM_CONFIG_<NAME>`` (set by ``trainer launch``), else 1.

    Args:
        dp_replicate_size: replicas (DDP, or HSDP's replicate dimension).
        dp_shard_size: processes that shard parameters, gradients and optimizer state (FSDP2).
        tp_size: processes that split each layer (DTensor tensor parallelism).
        cp_size: processes that split each sequence (ring attention).
        cp_comm_strategy: how context parallelism rotates keys and values: "allgather" or
            "alltoall".

    Raises:
        ConfigurationError: a size that is not an int >= 1; tp or cp with replicas but no
            sharding (DDP cannot compose with them: use ``dp_shard_size``); an unknown
            ``cp_comm_strategy``.

    Examples:
        >>> config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)  # HSDP on 4
        >>> config.total_size, config.fsdp_dim_names
        (4, ['dp_replicate', 'dp_shard_cp'])
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_comm_strategy: str | None = None
    device_mesh: Any = field(default=None, init=False, repr=False)  # built once, on first use

    def __post_init__(self) -> None:
        for name in _SIZE_FIELDS:
            value = getattr(self, name)
            if value is None:
                env = f"PARALLELISM_CONFIG_{name.upper()}"
                text = os.environ.get(env, "1")
                if not text.isdigit():
                    raise ConfigurationError(f"{env}={text!r}: expected an int >= 1, e.g. 2.")
                value = int(text)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(
                    f"ParallelismConfig({name}={describe(value)}): expected an int >= 1, e.g. "
                    f"{name}=2 (1 turns that dimension off)."
                )
            setattr(self, name, value)
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get(
                "PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather"
            )
        if self.cp_comm_strategy not in _CP_COMM_STRATEGIES:
            raise ConfigurationError(
                f"ParallelismConfig(cp_comm_strategy={describe(self.cp_comm_strategy)}): "
                f"expected one of {', '.join(map(repr, _CP_COMM_STRATEGIES))}."
            )
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled:
            if not self.dp_shard_enabled:
                raise ConfigurationError(
                    f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, "
                    f"dp_shard_size=1, tp_size={self.tp_size}, cp_size={self.cp_size}): "
                    "tensor/context parallelism cannot compose with pure replication (DDP). "
                    f"Use dp_shard_size={self.dp_replicate_size} and dp_replicate_size=1 (FSDP "
                    "+ TP/CP), or dp_shard_size > 1 with the replicas (HSDP + TP/CP)."
                )

    # ---- sizes (Accelerate's names) ---------------------------------------------------
    @property
    def sizes(self) -> dict[str, int]:
        """Each mesh dimension's size, in mesh order: ``{"dp_replicate": 2, ...}``."""
        return {
            "dp_replicate": int(self.dp_replicate_size or 1),
            "dp_shard": int(self.dp_shard_size or 1),
            "cp": int(self.cp_size or 1),
            "tp": int(self.tp_size or 1),
        }

    @property
    def total_size(self) -> int:
        """The number of processes these sizes describe."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Processes that read different batches: ``dp_replicate_size * dp_shard_size``."""
        return self.sizes["dp_replicate"] * self.sizes["dp_shard"]

    @property
    def non_data_parallel_size(self) -> int:
        """Processes that share each batch: ``tp_size * cp_size``."""
        return self.sizes["tp"] * self.sizes["cp"]

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.sizes["dp_replicate"] > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.sizes["dp_shard"] > 1

    @property
    def tp_enabled(self) -> bool:
        return self.sizes["tp"] > 1

    @property
    def cp_enabled(self) -> bool:
        return self.sizes["cp"] > 1

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dims FSDP runs over: ``dp_shard_cp``, after ``dp_replicate`` for HSDP."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def is_sharded(self) -> bool:
        """Whether a ModelParallelStrategy runs it (anything beyond replication)."""
        return self.dp_shard_enabled or self.tp_enabled or self.cp_enabled

    # ---- meshes ------------------------------------------------------------------------
    def build_meshes(self, device_type: str, world_size: int) -> ParallelMeshes:
        """The mesh over ``world_size`` processes and the sub-meshes ModelParallelStrategy uses.

        The mesh has all four dims (size-1 ones too, so ``mesh["tp"]`` always exists) and the
        flattened ``dp`` (data parallel), ``dp_shard_cp`` (FSDP) and ``dp_cp`` (loss) dims.

        Raises:
            ConfigurationError: sizes whose product is not ``world_size``; ``cp_size > 1``
                on a device without a context-parallel attention kernel (the CPU).
        """
        self.check_world_size(world_size)
        check_context_parallel_device(self, device_type)
        from torch.distributed.device_mesh import init_device_mesh

        sizes = self.sizes
        mesh = init_device_mesh(
            device_type, tuple(sizes[d] for d in MESH_DIMS), mesh_dim_names=MESH_DIMS
        )
        # Keep what _flatten returns: slicing a flattened dim from the root mesh is deprecated.
        # DeviceMesh has no public way to flatten dims (torchtitan calls _flatten too).
        data = mesh["dp_replicate", "dp_shard"]._flatten("dp")  # noqa: SLF001
        shard = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")  # noqa: SLF001
        mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")  # noqa: SLF001
        fsdp = shard
        if self.dp_replicate_enabled:  # fully_shard on a 2-D mesh is HSDP: replicate x shard
            fsdp = mesh["dp_replicate", "dp_shard_cp" if self.cp_enabled else "dp_shard"]
        self.device_mesh = mesh
        return ParallelMeshes(
            device_mesh=mesh,
            data_parallel=data,
            tensor_parallel=mesh["tp"],
            fully_shard=fsdp,
            context_parallel=mesh["cp"] if self.cp_enabled else None,
        )

    def check_world_size(self, world_size: int) -> None:
        """ConfigurationError unless the sizes multiply to ``world_size``."""
        if self.total_size != world_size:
            sizes = ", ".join(f"{name}={getattr(self, name)}" for name in _SIZE_FIELDS)
            raise ConfigurationError(
                f"ParallelismConfig({sizes}): {self.total_size} processes, but this job has "
                f"{world_size}. Choose sizes whose product is {world_size} (launch with "
                f"--nproc_per_node {self.total_size}, or change the sizes)."
            )


def check_context_parallel_device(config: ParallelismConfig, device_type: str) -> None:
    """ConfigurationError for ``cp_size > 1`` where torch cannot shard attention (the CPU)."""
    if config.cp_enabled and device_type != "cuda":
        raise ConfigurationError(
            f"ParallelismConfig(cp_size={config.cp_size}) on {device_type!r}: context "
            "parallelism shards torch's CUDA attention kernels (flash, efficient, cuDNN); torch "
            "has no context-parallel CPU attention (gloo). Run on CUDA GPUs, or set cp_size=1 "
            "and give the processes to dp_shard_size."
        )


def strategy_for_parallelism(
    config: ParallelismConfig,
    *,
    accelerator: str | None = None,
    fsdp_options: dict[str, Any] | None = None,
) -> Strategy:
    """The existing strategy that runs ``config``, not yet set up.

    - every size 1: ``DDPStrategy`` over all processes (Accelerate does the same), or
      ``SingleDeviceStrategy`` in one process;
    - ``dp_replicate_size`` only: ``DDPStrategy``;
    - anything sharded, tensor or context parallel: ``ModelParallelStrategy`` with ``config`` as
      its mesh layout: FSDP2 over ``dp_shard_cp``, HSDP over ``(dp_replicate, dp_shard_cp)``,
      data split over ``dp``, the TP plan applied by the user on ``device_mesh["tp"]``.

    The ``Accelerator(parallelism_config=...)`` constructor calls this.

    Args:
        config: the sizes.
        accelerator: "cpu", "cuda" or None (CUDA when available).
        fsdp_options: ModelParallelStrategy keywords (``auto_wrap_policy``,
            ``reshard_after_forward``, ``activation_checkpointing``,
            ``save_distributed_checkpoint``, ``process_group_backend``) for sharded layouts.

    Raises:
        ConfigurationError: sizes whose product is not the launcher's number of processes;
            ``cp_size > 1`` on the CPU; ``fsdp_options`` for a layout that does not shard.

    Examples:
        >>> strategy_for_parallelism(ParallelismConfig(), accelerator="cpu")  # one process
        SingleDeviceStrategy(device=cpu, precision='32-true')
    """
    world_size = detect_environment().world_size
    if config.total_size == 1 and world_size > 1:
        config = ParallelismConfig(dp_replicate_size=world_size, cp_size=1, tp_size=1)
    config.check_world_size(world_size)
    device_type = accelerator or ("cuda" if torch.cuda.is_available() else "cpu")
    check_context_parallel_device(config, device_type)
    if config.is_sharded:
        from trainer.strategies.model_parallel import ModelParallelStrategy

        return ModelParallelStrategy(accelerator, mesh_layout=config, **(fsdp_options or {}))
    if fsdp_options:
        raise ConfigurationError(
            f"strategy_for_parallelism(fsdp_options={describe(fsdp_options)}): "
            f"ParallelismConfig(dp_replicate_size={config.dp_replicate_size}) only replicates "
            "(DDP), so there is nothing to shard. Set dp_shard_size > 1, or drop the FSDP "
            "options."
        )
    if world_size == 1:
        from trainer.strategies.single import SingleDeviceStrategy

        return SingleDeviceStrategy(accelerator)
    from trainer.strategies.ddp import DDPStrategy

    return DDPStrategy(accelerator)


@contextlib.contextmanager
def maybe_context_parallel(
    strategy: Strategy,
    buffers: list[torch.Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> Iterator[None]:
    """Shard ``buffers`` along their sequence dims over the ``cp`` mesh for one step.

    Accelerate's ``Accelerator.maybe_context_parallel``: with ``cp_size > 1`` the buffers
    (inputs, labels, position ids) are split in place across the context-parallel ranks and
    attention runs as ring attention; they are restored on exit unless named in
    ``no_restore_buffers``. Without context parallelism it does nothing. Enter it anew for
    every step.
    """
    layout = getattr(strategy, "mesh_layout", None)  # set by strategy_for_parallelism
    cp_mesh = strategy.meshes.context_parallel if layout is not None else None  # type: ignore[attr-defined]  # ModelParallelStrategy
    if cp_mesh is None:
        yield
        return
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(getattr(layout, "cp_comm_strategy", "allgather"))
    with context_parallel(
        cp_mesh,
        buffers=buffers,
        buffer_seq_dims=buffer_seq_dims,
        no_restore_buffers=no_restore_buffers,
    ):
        yield
