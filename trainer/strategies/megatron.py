"""MegatronStrategy: tensor (and, on GPU, pipeline) model parallelism with ``megatron.core``.

Owns: megatron.core's ``parallel_state`` for the job, initialised in ``setup_environment`` right
after the process group, so ``configure_model`` can build ``ColumnParallelLinear``,
``RowParallelLinear``, ``TransformerLayer``... (``model_parallel_config()`` fills their config);
data sharding and gradient all-reduce over the data-parallel group only (a torch
``DistributedDataParallel`` on that group); tensor-parallel-aware gradient clipping; the
all-reduce of sequence-parallel gradients over the tensor-parallel group; and checkpoints as
``torch.distributed.checkpoint`` shards inside our atomic directory, where each tensor-parallel
shard is written as a DTensor slice of the full tensor, so ``trainer checkpoint consolidate``
reassembles full weights and a checkpoint loads at another tensor-parallel size.

Not owned: the layers (the user builds them from megatron.core) and pipeline schedules (with
``pipeline_model_parallel_size > 1`` the user's ``training_step`` runs megatron's
``get_forward_backward_func()`` under manual optimization). Shared helpers (one-process group,
data-parallel collectives, size checks) live in ``model_parallel.py``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.checkpoint.sharded import (
    has_sharded_state,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)
from trainer.errors import CheckpointError, ConfigurationError, StrategyError
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.environment import ClusterEnvironment
from trainer.strategies.fsdp import _remember
from trainer.strategies.model_parallel import (
    DATA_PARALLEL,
    TENSOR_PARALLEL,
    all_gather_data_parallel,
    all_reduce_data_parallel,
    check_size,
    start_process_group,
)
from trainer.strategies.strategy import ReduceOp

__all__ = ["MegatronStrategy"]

PIPELINE_PARALLEL = "pipeline_parallel"
RNG_TRACKER_KEY = "megatron_rng_tracker_states"  # per-rank CUDA RNG streams, in state.json
_MESHES: dict[tuple[str, int, int, int], Any] = {}  # one mesh per layout and process


def _import_parallel_state() -> ModuleType:
    """``megatron.core.parallel_state``, or MissingDependencyError naming the extra."""
    from trainer._imports import require

    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
        require("megatron.core", extra="megatron", feature="MegatronStrategy")
    from megatron.core import parallel_state

    return parallel_state


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
        self._check_features()
        self._parallel_state = _import_parallel_state()  # fail here, not after the launch
        self._device_mesh: Any = None
        self._modules: list[torch.nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._is_accumulating = False

    def _check_features(self) -> None:
        """Reject combinations megatron.core cannot run, naming the argument to change."""
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ConfigurationError(
                "MegatronStrategy(sequence_parallel=True) splits activations between "
                "tensor-parallel peers: set tensor_model_parallel_size >= 2, or sequence_parallel=False."
            )
        if self.accelerator_type == "cuda":
            return
        for argument, is_used in (
            ("sequence_parallel=True", self.sequence_parallel),
            (
                f"pipeline_model_parallel_size={self.pipeline_model_parallel_size}",
                self.pipeline_model_parallel_size > 1,
            ),
        ):
            if is_used:
                raise ConfigurationError(
                    f"MegatronStrategy({argument}) needs CUDA: megatron.core runs it with CUDA "
                    f"streams and GPU buffers (accelerator={self.accelerator_type!r}). Use "
                    "accelerator='cuda', or tensor parallelism alone on CPU."
                )

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
        start_process_group(self)
        model_parallel = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        if self.world_size % model_parallel:
            raise ConfigurationError(
                f"MegatronStrategy(tensor_model_parallel_size={self.tensor_model_parallel_size}, "
                f"pipeline_model_parallel_size={self.pipeline_model_parallel_size}): their product "
                f"{model_parallel} does not divide the {self.world_size} processes of this job. "
                f"Launch a multiple of {model_parallel} processes or choose smaller sizes."
            )
        self._initialize_parallel_state()
        if self.accelerator_type == "cuda":
            self._seed_rng_tracker(self.seed if self.seed is not None else torch.initial_seed())
        self._device_mesh = self._build_mesh()

    def _initialize_parallel_state(self) -> None:
        """(Re)initialise megatron's groups; an earlier strategy's equal layout is reused."""
        ps = self._parallel_state
        wanted = (
            self.tensor_model_parallel_size,
            self.pipeline_model_parallel_size,
            self.virtual_pipeline_model_parallel_size,
        )
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
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            pipeline_model_parallel_size=self.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=self.virtual_pipeline_model_parallel_size,
            distributed_timeout_minutes=max(1, int(self.timeout.total_seconds() // 60)),
            create_gloo_process_groups=self.accelerator_type == "cuda",
        )

    def _build_mesh(self) -> Any:
        """The (pp, dp, tp) DeviceMesh whose coordinates are megatron's ranks (for DTensor shards)."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = (
            self.pipeline_model_parallel_size,
            self.data_parallel_size,
            self.tensor_model_parallel_size,
        )
        key = (self.root_device.type, *shape)
        if key not in _MESHES:
            _MESHES[key] = init_device_mesh(
                self.root_device.type,
                shape,
                mesh_dim_names=(PIPELINE_PARALLEL, DATA_PARALLEL, TENSOR_PARALLEL),
            )
        mesh = _MESHES[key]
        coordinates = tuple(mesh.get_local_rank(name) for name in mesh.mesh_dim_names)
        expected = (
            self.pipeline_model_parallel_rank,
            self.data_parallel_rank,
            self.tensor_model_parallel_rank,
        )
        if coordinates != expected:  # megatron changed its rank order: shards would be misplaced
            raise StrategyError(
                f"MegatronStrategy: the device mesh puts rank {self.global_rank} at (pp, dp, tp) = "
                f"{coordinates} but megatron.core at {expected}. This megatron-core version orders "
                "ranks differently; pin megatron-core to a tested version (see docs/strategies/megatron.md)."
            )
        return mesh

    def _seed_rng_tracker(self, seed: int) -> None:
        """Megatron's CUDA RNG tracker: one stream per tensor-parallel rank (dropout in TP regions)."""
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(int(seed) % (2**63 - 3000))

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
            self._seed_rng_tracker(self.seed if self.seed is not None else torch.initial_seed())
        return contextlib.nullcontext()

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Place the module; wrap it in DDP over the data-parallel group when there are replicas."""
        module = self.precision.convert_module(module).to(self.root_device)
        self._broadcast_replicated_parameters(module)
        _remember(self._modules, module)
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
        _remember(self._optimizers, optimizer)  # sharded checkpoints load into these
        return optimizer

    @torch.no_grad()
    def _broadcast_replicated_parameters(self, module: torch.nn.Module) -> None:
        """Parameters every tensor-parallel peer holds whole (biases of row-parallel layers,
        norms) start equal on all peers: tensor-parallel rank 0's values."""
        if self.tensor_model_parallel_size == 1:
            return
        group = self._parallel_state.get_tensor_model_parallel_group()
        source = self._parallel_state.get_tensor_model_parallel_src_rank()
        for param in module.parameters():
            if not _is_tensor_parallel(param):
                dist.broadcast(param.data, src=source, group=group)

    # ---- training ----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None, **kwargs: Any) -> None:
        """Backpropagate; on synchronising batches, sum sequence-parallel gradients over TP."""
        super().backward(loss, module, **kwargs)
        if self.sequence_parallel and not self._is_accumulating:
            self._all_reduce_sequence_parallel_grads()

    def _all_reduce_sequence_parallel_grads(self) -> None:
        """Norm weights see only this peer's part of the sequence: their gradients are partial."""
        grads = [
            p.grad
            for module in self._modules
            for p in module.parameters()
            if p.grad is not None and getattr(p, "sequence_parallel", False)
        ]
        if not grads:
            return
        flat = torch.cat([grad.reshape(-1) for grad in grads])  # one collective for all
        dist.all_reduce(flat, group=self._parallel_state.get_tensor_model_parallel_group())
        for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(part.view_as(grad))

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
        params = [p for p in parameters if p.grad is not None]
        is_first_peer = self.tensor_model_parallel_rank == 0
        owned = [p.grad for p in params if _is_tensor_parallel(p) or is_first_peer]
        group = self._parallel_state.get_model_parallel_group()
        device = self.root_device
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

    # ---- collectives -------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        """Sum/mean over data-parallel ranks (model-parallel peers hold copies); max/min over all."""
        return all_reduce_data_parallel(tensor, op, self._parallel_state.get_data_parallel_group())

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """One row per data-parallel rank: each sample once, not once per model-parallel peer."""
        return all_gather_data_parallel(tensor, self._parallel_state.get_data_parallel_group())

    # ---- state -------------------------------------------------------------------------
    def _is_split(self, param: torch.Tensor) -> bool:
        """Whether ``param`` is one of several tensor-parallel shards (megatron marks it even at TP=1)."""
        return _is_tensor_parallel(param) and self.tensor_model_parallel_size > 1

    def _stage_prefix(self) -> str:
        """Pipeline stages hold different layers under the same local names: keep them apart."""
        if self.pipeline_model_parallel_size == 1:
            return ""
        return f"pipeline_stage_{self.pipeline_model_parallel_rank}."

    def _as_dtensor(self, local: torch.Tensor, param: torch.Tensor) -> Any:
        """This rank's shard as a slice of the full tensor (DCP writes and reshards by it)."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        dim, stride = _partition(param)
        if stride != 1:
            raise CheckpointError(
                f"MegatronStrategy: a parameter of shape {tuple(param.shape)} is split with "
                f"partition_stride={stride}; sharded checkpoints support stride 1 only."
            )
        shape = list(local.shape)
        shape[dim] *= self.tensor_model_parallel_size
        mesh = self.device_mesh[DATA_PARALLEL, TENSOR_PARALLEL]
        return DTensor.from_local(
            local,
            mesh,
            [Replicate(), Shard(dim)],
            run_check=False,
            shape=torch.Size(shape),
            stride=torch.empty(shape, device="meta").stride(),
        )

    def _gather_shards(self, local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """The full tensor: the tensor-parallel peers' shards concatenated."""
        dim, _ = _partition(param)
        group = self._parallel_state.get_tensor_model_parallel_group()
        pieces = [torch.empty_like(local) for _ in range(self.tensor_model_parallel_size)]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        """``full``: shards gathered into whole tensors (every rank); else DTensor shards for DCP.

        Megatron layers' ``_extra_state`` entries (always None) are left out.
        """
        inner = self.unwrap_module(module)
        params = dict(inner.named_parameters(remove_duplicate=False))
        prefix = "" if full else self._stage_prefix()
        state: dict[str, Any] = {}
        for key, value in inner.state_dict().items():
            if value is None:
                continue
            param = params.get(key)
            if param is not None and self._is_split(param):
                value = (
                    self._gather_shards(value, param) if full else self._as_dtensor(value, param)
                )
            state[prefix + key] = value
        return state

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load DTensor shards, local shards, or full tensors (sliced to this rank's shard)."""
        inner = self.unwrap_module(module)
        params = dict(inner.named_parameters(remove_duplicate=False))
        own = inner.state_dict()
        prefix = self._stage_prefix()
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
                value = self._take_shard(value, param)
            local[key] = value
        local.update({k: None for k, v in own.items() if v is None and k not in local})
        inner.load_state_dict(local, strict=strict)

    def _take_shard(self, full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full tensor (a dense or consolidated checkpoint)."""
        if not _is_tensor_parallel(param):
            return full  # a shape mismatch: load_state_dict reports it
        dim, _ = _partition(param)
        if full.shape[dim] != param.shape[dim] * self.tensor_model_parallel_size:
            return full
        return full.chunk(self.tensor_model_parallel_size, dim=dim)[self.tensor_model_parallel_rank]

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
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        owner = self._owner(optimizer)
        state = get_optimizer_state_dict(
            owner, optimizer, options=StateDictOptions(full_state_dict=False)
        )
        params = dict(owner.named_parameters())
        for name, entries in state["state"].items():
            param = params.get(name)
            if param is None or not self._is_split(param):
                continue
            for key, value in entries.items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape:
                    entries[key] = self._as_dtensor(value, param)
        prefix = self._stage_prefix()
        return {prefix.rstrip("."): state} if prefix else state

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        prefix = self._stage_prefix().rstrip(".")
        state = state_dict.get(prefix, state_dict) if prefix else state_dict
        if not any(isinstance(k, str) for k in state.get("state", {})):
            optimizer.load_state_dict(self._shard_index_keyed(optimizer, state))
            return
        state = {
            "state": {
                name: {k: v.to_local() if hasattr(v, "to_local") else v for k, v in entries.items()}
                for name, entries in state["state"].items()
            },
            "param_groups": state["param_groups"],
        }
        set_optimizer_state_dict(
            self._owner(optimizer),
            optimizer,
            state,
            options=StateDictOptions(full_state_dict=False),
        )

    def _shard_index_keyed(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> dict[str, Any]:
        """torch's index-keyed state of a dense (single-process) run: keep this rank's slices."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        sliced = {}
        for index, entries in state.get("state", {}).items():
            param = params[int(index)]
            sliced[index] = {
                key: self._take_shard(value, param)
                if isinstance(value, torch.Tensor) and value.shape not in (param.shape, ())
                else value
                for key, value in entries.items()
            }
        return {**state, "state": sliced}

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """Every rank writes its DCP shards; rank 0 moves them into the atomic directory."""
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
        save_sharded_checkpoint(self, path, checkpoint)

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


def _is_tensor_parallel(param: torch.Tensor) -> bool:
    """Megatron marks split parameters with ``tensor_model_parallel=True``."""
    return bool(getattr(param, "tensor_model_parallel", False))


def _partition(param: torch.Tensor) -> tuple[int, int]:
    """(dimension, stride) along which megatron split ``param``."""
    return int(getattr(param, "partition_dim", 0)), int(getattr(param, "partition_stride", 1))
