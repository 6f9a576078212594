"""The Accelerator's n-D parallelism facts: Accelerate's ``torch_device_mesh``, each dimension's
rank, ``should_save_model``, ``is_composable_parallelism_enabled`` and ``maybe_context_parallel``.

`ParallelismAPI` is a base of `trainer.accelerator.Accelerator`. The sizes and the mesh are
``trainer.accelerator.parallelism``'s; this class only reads them for the current process.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import torch

from trainer.accelerator.parallelism import MESH_DIMS, maybe_context_parallel
from trainer.errors import ConfigurationError
from trainer.runtime.state import DistributedType

if TYPE_CHECKING:
    from trainer.accelerator.parallelism import ParallelismConfig
    from trainer.strategies import Strategy

__all__ = ["ParallelismAPI"]


class ParallelismAPI:
    """Where this process sits in the ``ParallelismConfig`` mesh (Accelerate's properties)."""

    strategy: Strategy  # set by the Accelerator's constructor
    parallelism_config: ParallelismConfig | None
    process_index: int
    is_local_main_process: bool
    distributed_type: DistributedType

    @property
    def torch_device_mesh(self) -> Any:
        """The ``DeviceMesh`` of ``parallelism_config`` (dims ``dp_replicate``, ``dp_shard``,
        ``cp``, ``tp`` and the flattened ``dp``, ``dp_shard_cp``, ``dp_cp``), once the strategy
        built it; None without sharding, tensor or context parallelism (pure replication is
        plain DDP, with no mesh) or without a config."""
        if self.parallelism_config is None:
            return None
        return getattr(self.strategy, "device_mesh", None)

    @property
    def should_save_model(self) -> bool:
        """Accelerate's rule: every process takes part in saving under a ``parallelism_config``
        (the model's state is spread over them); otherwise the local main process."""
        return True if self.parallelism_config is not None else self.is_local_main_process

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether parameters are sharded with FSDP2 (what n-D parallelism composes with)."""
        return self.distributed_type is DistributedType.FSDP

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among the replicas (``dp_replicate``); 0 when not replicated."""
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index in its shard group (``dp_shard``); 0 when not sharded."""
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index in its tensor-parallel group (``tp``); 0 without it."""
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index in its context-parallel group (``cp``); 0 without it.
        (Accelerate 1.15 raises NotImplementedError; context parallelism runs here.)"""
        return self._mesh_rank("cp", "Context parallelism")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Not a mesh dimension here, as in Accelerate: raises NotImplementedError."""
        raise NotImplementedError(
            "pipeline_parallel_rank: pipeline parallelism is not a ParallelismConfig dimension "
            "(as in Accelerate); pipeline stages come from prepare_pippy."
        )

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Split ``buffers`` along ``buffer_seq_dims`` over the ``cp`` ranks for one step (ring
        attention); a no-op without context parallelism. Enter it anew for every step."""
        return maybe_context_parallel(self.strategy, buffers, buffer_seq_dims, no_restore_buffers)

    def _mesh_rank(self, dim: str, what: str) -> int:
        config = self.parallelism_config
        if config is None:
            raise ConfigurationError(
                f"{what} is not configured: pass Accelerator(parallelism_config="
                "ParallelismConfig(...)) to read its rank (as in Accelerate)."
            )
        sizes = config.sizes  # the mesh is laid out row-major in MESH_DIMS order
        inner = math.prod(sizes[name] for name in MESH_DIMS[MESH_DIMS.index(dim) + 1 :])
        return (self.process_index // inner) % sizes[dim]
