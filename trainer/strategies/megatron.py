"""MegatronStrategy: tensor (and, on GPU, pipeline) model parallelism with ``megatron.core``.

Owns: megatron.core's ``parallel_state`` for the job, initialised in ``setup_environment`` right
after the process group, so ``configure_model`` can build ``ColumnParallelLinear``,
``RowParallelLinear``, ``TransformerLayer``... (``model_parallel_config()`` fills their config);
data sharding and gradient all-reduce over the data-parallel group only (a torch
``DistributedDataParallel`` on that group); tensor-parallel-aware gradient clipping; the
all-reduce of sequence-parallel gradients over the tensor-parallel group; and checkpoints as
``torch.distributed.checkpoint`` shards inside our atomic directory (with ``AsyncCheckpointIO``,
from DCP's ``async_save``: `start_async_save`), where each tensor-parallel
shard is written as a DTensor slice of the full tensor, so ``trainer checkpoint consolidate``
reassembles full weights and a checkpoint loads at another tensor-parallel size.

This file holds the strategy: its arguments and their checks, the order of setup, and the
verbs. Beside it, ``megatron_parallel.py`` holds megatron's groups, the mesh and the
collectives over them, and ``megatron_state.py`` the sharded state dicts.

Not owned: the layers (the user builds them from megatron.core) and pipeline schedules (with
``pipeline_model_parallel_size > 1`` the user's ``training_step`` runs megatron's
``get_forward_backward_func()`` under manual optimization). Shared helpers (one-process group,
data-parallel collectives, size checks) live in ``model_parallel.py``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from trainer.checkpoint.sharded import (
    has_sharded_state,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)
from trainer.errors import ConfigurationError, StrategyError
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.environment import ClusterEnvironment
from trainer.strategies.fsdp import append_once
from trainer.strategies.megatron_parallel import PIPELINE_PARALLEL as PIPELINE_PARALLEL
from trainer.strategies.megatron_parallel import (
    all_reduce_sequence_parallel_grads,
    broadcast_replicated_parameters,
    build_device_mesh,
    check_divides,
    check_features,
    check_precision,
    clip_grad_norm_model_parallel,
    import_parallel_state,
    initialize_parallel_state,
    seed_rng_tracker,
)
from trainer.strategies.megatron_state import (
    load_module_state,
    load_optimizer_state,
    module_state,
    optimizer_state,
)
from trainer.strategies.model_parallel import (
    all_gather_data_parallel,
    all_reduce_data_parallel,
    check_size,
)
from trainer.strategies.strategy import ReduceOp

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.staging import AsyncStager

    from trainer.checkpoint.sharded_async import AsyncShardedSave

__all__ = ["MegatronStrategy"]

RNG_TRACKER_KEY = "megatron_rng_tracker_states"  # per-rank CUDA RNG streams, in state.json


class MegatronStrategy(DDPStrategy):
    """megatron.core model parallelism, with data parallelism over the remaining processes.

    The ``world_size`` processes are split as megatron orders them (tp-dp-pp): tensor-parallel
    peers are neighbouring ranks, then data-parallel replicas, then pipeline stages; so
    ``data_parallel_size = world_size // (tensor_model_parallel_size * pipeline_model_parallel_size)``.

    Args:
        accelerator: "cpu", "cuda" or None (CUDA when available).
        precision: the Precision plugin (the Accelerator fills it in when None).
        tensor_model_parallel_size: processes that split each megatron layer.
        pipeline_model_parallel_size: pipeline stages (CUDA only: megatron's p2p
            communication allocates on the GPU).
        virtual_pipeline_model_parallel_size: model chunks per stage (interleaved schedule).
        sequence_parallel: split activations along the sequence between tensor-parallel peers
            (CUDA only); gradients of parameters marked ``sequence_parallel`` are all-reduced
            over the tensor-parallel group after backward.
        seed: the seed of megatron's CUDA RNG tracker (default: ``torch.initial_seed()`` when
            ``configure_model`` runs, i.e. the Trainer's ``seed``).
        find_unused_parameters: passed to the ``DistributedDataParallel`` over the
            data-parallel group.
        static_graph: passed to that ``DistributedDataParallel``.
        gradient_as_bucket_view: passed to that ``DistributedDataParallel``.
        bucket_cap_mb: passed to that ``DistributedDataParallel``.
        process_group_backend: "nccl", "gloo" or None (nccl on CUDA, gloo on CPU).
        timeout: the collective timeout.

    Raises:
        ConfigurationError: a size that is not an int >= 1; sequence parallelism without
            tensor parallelism; a CUDA-only feature on CPU; sizes that do not divide the
            number of processes (in ``setup_environment``).
        MissingDependencyError: megatron-core is not installed.

    Examples:
        >>> # 4 processes: layers split over 2, two data-parallel replicas
        >>> Trainer(strategy=MegatronStrategy(tensor_model_parallel_size=2), devices=4)
    """

    name = "megatron"
    should_keep_process_group = True  # its sharded state / engine holds the group after fit
    forward_needs_all_processes = True  # gathers shards or tensor-parallel parts

    def __init__(
        self,
        accelerator: str | None = None,
        *,
        precision: Precision | None = None,
        tensor_model_parallel_size: int = 1,
        pipeline_model_parallel_size: int = 1,
        virtual_pipeline_model_parallel_size: int | None = None,
        sequence_parallel: bool = False,
        seed: int | None = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: float | None = None,
        process_group_backend: str | None = None,
        timeout: dt.timedelta = dt.timedelta(minutes=30),
        environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(
            accelerator,
            precision=precision,
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
            bucket_cap_mb=bucket_cap_mb,
            process_group_backend=process_group_backend,
            timeout=timeout,
            environment=environment,
        )
        owner = "MegatronStrategy"
        self.tensor_model_parallel_size = int(
            check_size(owner, "tensor_model_parallel_size", tensor_model_parallel_size)
        )
        self.pipeline_model_parallel_size = int(
            check_size(owner, "pipeline_model_parallel_size", pipeline_model_parallel_size)
        )
        virtual = virtual_pipeline_model_parallel_size
        self.virtual_pipeline_model_parallel_size = (
            None
            if virtual is None
            else int(check_size(owner, "virtual_pipeline_model_parallel_size", virtual))
        )
        self.sequence_parallel = bool(sequence_parallel)
        self.seed = seed
        check_features(
            tensor=self.tensor_model_parallel_size,
            pipeline=self.pipeline_model_parallel_size,
            sequence_parallel=self.sequence_parallel,
            accelerator_type=self.accelerator_type,
        )
        self._parallel_state = import_parallel_state()  # fail here, not after the launch
        self._device_mesh: Any = None
        self._modules: list[torch.nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._is_accumulating = False

    # ---- facts -------------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:  # type: ignore[override]
        return DistributedType.MEGATRON_LM

    @property
    def parallel_state(self) -> ModuleType:
        """``megatron.core.parallel_state`` (groups and ranks of this job)."""
        return self._parallel_state

    @property
    def device_mesh(self) -> Any:
        """A ``DeviceMesh`` (pipeline_parallel, data_parallel, tensor_parallel) laid out as megatron's groups.

        Raises:
            StrategyError: before ``setup_environment``.
        """
        if self._device_mesh is None:
            raise StrategyError(
                "MegatronStrategy.device_mesh is built by setup_environment(); create the "
                "Trainer or Accelerator with this strategy first."
            )
        return self._device_mesh

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (
            self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        )

    @property
    def tensor_model_parallel_rank(self) -> int:
        return self._parallel_state.get_tensor_model_parallel_rank()

    @property
    def pipeline_model_parallel_rank(self) -> int:
        return self._parallel_state.get_pipeline_model_parallel_rank()

    @property
    def data_parallel_rank(self) -> int:
        return self._parallel_state.get_data_parallel_rank()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Shard data across data-parallel ranks only: model-parallel peers share each batch."""
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Process group, then megatron's groups (before ``configure_model``), then the mesh."""
        check_precision(self.precision.name, self.accelerator_type)
        self._start_or_join_process_group()
        check_divides(
            self.world_size,
            tensor=self.tensor_model_parallel_size,
            pipeline=self.pipeline_model_parallel_size,
        )
        initialize_parallel_state(
            self._parallel_state,
            tensor=self.tensor_model_parallel_size,
            pipeline=self.pipeline_model_parallel_size,
            virtual=self.virtual_pipeline_model_parallel_size,
            timeout=self.timeout,
            accelerator_type=self.accelerator_type,
        )
        if self.accelerator_type == "cuda":
            seed_rng_tracker(self.seed if self.seed is not None else torch.initial_seed())
        self._device_mesh = build_device_mesh(
            self._parallel_state,
            self.root_device.type,
            (
                self.pipeline_model_parallel_size,
                self.data_parallel_size,
                self.tensor_model_parallel_size,
            ),
            self.global_rank,
        )

    def model_parallel_config(self, config_class: type | None = None, **overrides: Any) -> Any:
        """A megatron ``ModelParallelConfig`` (or ``config_class``, e.g. ``TransformerConfig``) for this job.

        Fills the parallel sizes, ``sequence_parallel``, ``use_cpu_initialization`` (on CPU, where
        megatron cannot initialise on the GPU), and ``params_dtype``/``pipeline_dtype`` from a
        true-half precision; ``overrides`` win.

        Examples:
            >>> config = trainer.strategy.model_parallel_config()
            >>> ColumnParallelLinear(4, 8, config=config, init_method=torch.nn.init.xavier_normal_)
        """
        if config_class is None:
            from megatron.core import ModelParallelConfig

            config_class = ModelParallelConfig
        dtype = self.precision.param_dtype or torch.float32
        values: dict[str, Any] = {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": self.virtual_pipeline_model_parallel_size,
            "sequence_parallel": self.sequence_parallel,
            "use_cpu_initialization": self.accelerator_type != "cuda",
            "params_dtype": dtype,
            "pipeline_dtype": dtype if self.pipeline_model_parallel_size > 1 else None,
        }
        values.update(overrides)
        return config_class(**values)

    def module_init_context(self) -> contextlib.AbstractContextManager[Any]:
        """On CUDA, reseed megatron's RNG tracker from the run's seed before layers are built."""
        if self.accelerator_type == "cuda":
            seed_rng_tracker(self.seed if self.seed is not None else torch.initial_seed())
        return contextlib.nullcontext()

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Place the module; wrap it in DDP over the data-parallel group when there are replicas."""
        module = self.precision.convert_module(module).to(self.root_device)
        if self.tensor_model_parallel_size > 1:
            broadcast_replicated_parameters(module, self._parallel_state)
        append_once(self._modules, module)
        if self.data_parallel_size == 1 or not any(p.requires_grad for p in module.parameters()):
            return module
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        wrapped = DistributedDataParallel(
            module,
            device_ids=device_ids,
            process_group=self._parallel_state.get_data_parallel_group(),
            **self.ddp_kwargs,
        )
        self._wrapped.append(wrapped)
        return wrapped

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        append_once(self._optimizers, optimizer)  # sharded checkpoints load into these
        return optimizer

    # ---- training ----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None, **kwargs: Any) -> None:
        """Backpropagate; on synchronising batches, sum sequence-parallel gradients over TP."""
        super().backward(loss, module, **kwargs)
        if self.sequence_parallel and not self._is_accumulating:
            all_reduce_sequence_parallel_grads(
                self._modules, self._parallel_state.get_tensor_model_parallel_group()
            )

    @contextlib.contextmanager
    def no_backward_sync(self, module: torch.nn.Module) -> Iterator[None]:
        self._is_accumulating = True
        try:
            if isinstance(module, DistributedDataParallel):
                with module.no_sync():
                    yield
            else:
                yield
        finally:
            self._is_accumulating = False

    def clip_grad_norm_(
        self,
        module: torch.nn.Module | None,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Clip by the norm of the whole model: TP shards all count, replicas count once.

        As megatron's ``clip_grad_norm_fp32``: each rank adds the shards it owns (replicated
        parameters on tensor-parallel rank 0 only), summed over the model-parallel group.
        """
        return clip_grad_norm_model_parallel(
            parameters,
            max_norm,
            norm_type,
            is_first_peer=self.tensor_model_parallel_rank == 0,
            group=self._parallel_state.get_model_parallel_group(),
            device=self.root_device,
        )

    # ---- collectives -------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        """Sum/mean over data-parallel ranks (model-parallel peers hold copies); max/min over all."""
        group = self._parallel_state.get_data_parallel_group()
        return all_reduce_data_parallel(tensor, op, group, self.root_device)

    def all_gather(
        self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> torch.Tensor:
        """One row per data-parallel rank: each sample once, not once per model-parallel peer.
        A ``group`` or ``sync_grads`` (Lightning's arguments) gathers as DDPStrategy does."""
        if group is not None or sync_grads:
            return super().all_gather(tensor, group, sync_grads)
        group = self._parallel_state.get_data_parallel_group()
        return all_gather_data_parallel(tensor, group, self.root_device)

    # ---- state -------------------------------------------------------------------------
    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        """``full``: shards gathered into whole tensors (every rank); else DTensor shards for DCP.

        Megatron layers' ``_extra_state`` entries (always None) are left out.
        """
        return module_state(self.unwrap_module(module), self, full=full)

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load DTensor shards, local shards, or full tensors (sliced to this rank's shard)."""
        load_module_state(self.unwrap_module(module), state_dict, self, strict=strict)

    def _owner(self, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for module in self._modules:
            if any(id(p) in params for p in module.parameters()):
                return module
        raise ConfigurationError(
            "MegatronStrategy: this optimizer's parameters belong to no prepared module; "
            "prepare the model before its optimizer."
        )

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """State keyed by parameter name; states of tensor-parallel parameters as DTensor shards."""
        return optimizer_state(self._owner(optimizer), optimizer, self)

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        """Load name-keyed state, or a dense run's index-keyed state sliced to this rank."""
        load_optimizer_state(optimizer, state_dict, self, owner_of=self._owner)

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """Every rank writes its DCP shards; rank 0 moves them into the atomic directory."""
        save_sharded_checkpoint(self, path, self._with_parallel_state(checkpoint))

    @property
    def has_sharded_checkpoints(self) -> bool:
        """Every rank writes its DCP shards (``AsyncCheckpointIO`` writes them in the background)."""
        return True

    def start_async_save(
        self,
        path: str | os.PathLike[str],
        checkpoint: dict[str, Any],
        *,
        process_group: ProcessGroup,
        stager: AsyncStager,
    ) -> AsyncShardedSave:
        """`save_checkpoint` in the background: copy this rank's shards, start DCP's ``async_save``.

        Every rank calls it on the training thread (``trainer.plugins.AsyncCheckpointIO`` does),
        as ``FSDPStrategy.start_async_save``; the checkpoint is committed as `save_checkpoint`'s.

        Args:
            path: the checkpoint directory to create or replace.
            checkpoint: the checkpoint dict, with this rank's sharded state dicts.
            process_group: the gloo group the background write uses (not training's).
            stager: copies the state to host memory before this returns.

        Returns:
            The save in flight (`trainer.checkpoint.sharded_async.AsyncShardedSave`).

        Raises:
            CheckpointError: on every rank, when ``path`` holds something that is not a
                checkpoint or a value cannot be stored.
        """
        from trainer.checkpoint.sharded_async import start_async_sharded_save

        checkpoint = self._with_parallel_state(checkpoint)
        return start_async_sharded_save(
            self, path, checkpoint, process_group=process_group, stager=stager
        )

    def _with_parallel_state(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """``checkpoint`` with the parallel sizes and, on CUDA, every rank's RNG tracker states
        (gathered: a collective)."""
        checkpoint = dict(checkpoint)
        checkpoint["model_parallel"] = {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "data_parallel_size": self.data_parallel_size,
        }
        if self.accelerator_type == "cuda":
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            checkpoint[RNG_TRACKER_KEY] = self.all_gather_object(
                get_cuda_rng_tracker().get_states()
            )
        return checkpoint

    def load_checkpoint(
        self, path: str | os.PathLike[str], module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        """Verify, read the JSON state, load the DCP shards into this rank's parameters/states.

        A checkpoint without DCP shards (single-process, or consolidated) loads as a full one:
        ``load_module_state_dict`` then slices each tensor to this rank's shard.
        """
        from trainer.checkpoint import read_checkpoint

        if not has_sharded_state(path):
            return read_checkpoint(path)
        module = module if module is not None else (self._modules[0] if self._modules else None)
        checkpoint = load_sharded_checkpoint(self, path, module, self._optimizers)
        tracker_states = checkpoint.get(RNG_TRACKER_KEY) or []
        if self.accelerator_type == "cuda" and len(tracker_states) == self.world_size:
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            get_cuda_rng_tracker().set_states(tracker_states[self.global_rank])
        return checkpoint

    def __repr__(self) -> str:
        return (
            f"MegatronStrategy(device={self.root_device}, world_size={self.world_size}, "
            f"tensor_model_parallel_size={self.tensor_model_parallel_size}, "
            f"pipeline_model_parallel_size={self.pipeline_model_parallel_size}, "
            f"precision={self.precision.name!r})"
        )
