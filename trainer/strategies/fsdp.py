"""FSDPStrategy: fully sharded data parallelism with PyTorch's FSDP2 (``fully_shard``).

Parameters, gradients and optimizer states are sharded over the processes (a 1-D device mesh);
each wrapped block is gathered just before its forward and backward. Order of application,
as torchtitan does it: activation checkpointing first (it wraps layers), then ``fully_shard`` on
each chosen layer, then on the root. Checkpoints: FULL gathers to rank 0 and writes safetensors;
SHARDED writes ``torch.distributed.checkpoint`` shards from every rank into the same atomic
directory with the same manifest, synchronously or, with ``AsyncCheckpointIO``, from DCP's
``async_save`` (`start_async_save`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.sharded import DCP_DIR as DCP_DIR  # re-exported: `trainer checkpoint`
from trainer.checkpoint.sharded import (
    has_sharded_state,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)
from trainer.errors import ConfigurationError
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.environment import ClusterEnvironment
from trainer.strategies.fsdp_config import parse_fsdp_config
from trainer.strategies.group_lifetime import release_mesh_with_groups

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.staging import AsyncStager

    from trainer.checkpoint.sharded_async import AsyncShardedSave

__all__ = ["FSDPStrategy"]


class FSDPStrategy(DDPStrategy):
    """FSDP2 over all processes of the job.

    Args:
        accelerator: "cpu", "cuda" or None (CUDA when available).
        precision: the Precision plugin; a mixed mode becomes FSDP's MixedPrecisionPolicy.
        reshard_after_forward: free gathered parameters after forward (FULL_SHARD) or keep them
            until backward (SHARD_GRAD_OP).
        cpu_offload: keep parameters (and their gradients and optimizer states) on the CPU.
        auto_wrap_policy: layer classes (or class names) to shard one by one; "size" shards
            every module holding at least ``min_num_params`` parameters; None only the root.
        cpu_ram_efficient_loading: ranks other than 0 build ``configure_model`` on the meta
            device and receive rank 0's weights by broadcast.
        activation_checkpointing: True (the wrapped layer classes) or layer classes/names to
            recompute in backward instead of storing activations.
        state_dict_type: "SHARDED" (DCP shards per rank) or "FULL" (gathered to rank 0).
        fsdp_config: an Accelerate ``fsdp_config`` (dict, YAML or JSON path); its values fill
            what the arguments leave unset. ``trainer launch`` passes one by environment.
        mixed_precision_policy: a ``torch.distributed.fsdp.MixedPrecisionPolicy`` used instead
            of the one derived from the precision plugin.
        process_group_backend: as for DDPStrategy.

    Examples:
        >>> FSDPStrategy(auto_wrap_policy={"Block"}, state_dict_type="FULL")
    """

    name = "fsdp"
    should_keep_process_group = True  # its sharded state / engine holds the group after fit
    forward_needs_all_processes = True  # gathers shards or tensor-parallel parts

    def __init__(
        self,
        accelerator: str | None = None,
        *,
        precision: Precision | None = None,
        reshard_after_forward: bool | None = None,
        cpu_offload: bool | None = None,
        auto_wrap_policy: set[type[torch.nn.Module] | str] | str | None = None,
        min_num_params: int | None = None,
        cpu_ram_efficient_loading: bool | None = None,
        activation_checkpointing: bool | set[type[torch.nn.Module] | str] | None = None,
        state_dict_type: str | None = None,
        fsdp_config: dict[str, Any] | str | os.PathLike[str] | None = None,
        mixed_precision_policy: Any = None,
        process_group_backend: str | None = None,
        timeout: dt.timedelta = dt.timedelta(minutes=30),
        environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(
            accelerator, precision=precision, process_group_backend=process_group_backend,
            timeout=timeout, environment=environment,
        )  # fmt: skip
        self.mixed_precision_policy = mixed_precision_policy
        if fsdp_config is None and os.environ.get("TRAINER_FSDP_CONFIG"):
            fsdp_config = json.loads(os.environ["TRAINER_FSDP_CONFIG"])  # from `trainer launch`
        from_config = parse_fsdp_config(fsdp_config) if fsdp_config is not None else {}
        self.ignored_config_keys: list[str] = from_config.pop("ignored", [])
        self.config_mixed_precision: str | None = from_config.pop("mixed_precision", None)

        def pick(value: Any, key: str, default: Any) -> Any:
            return value if value is not None else from_config.get(key, default)

        self.reshard_after_forward = bool(
            pick(reshard_after_forward, "reshard_after_forward", True)
        )
        self.cpu_offload = bool(pick(cpu_offload, "cpu_offload", False))
        self.auto_wrap_policy = pick(auto_wrap_policy, "auto_wrap_policy", None)
        self.min_num_params = int(pick(min_num_params, "min_num_params", 100_000_000))
        self.cpu_ram_efficient_loading = bool(
            pick(cpu_ram_efficient_loading, "cpu_ram_efficient_loading", False)
        )
        self.activation_checkpointing = pick(
            activation_checkpointing, "activation_checkpointing", False
        )
        self.state_dict_type = str(pick(state_dict_type, "state_dict_type", "SHARDED")).upper()
        if self.state_dict_type not in ("SHARDED", "FULL"):
            raise ConfigurationError(
                f"FSDPStrategy(state_dict_type={state_dict_type!r}): expected 'SHARDED' or 'FULL'."
            )
        if isinstance(self.auto_wrap_policy, str) and self.auto_wrap_policy != "size":
            raise ConfigurationError(
                f"FSDPStrategy(auto_wrap_policy={self.auto_wrap_policy!r}): expected layer classes or names, 'size', or None."
            )
        self._mesh: Any = None
        self._sharded: list[torch.nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []

    @property
    def distributed_type(self) -> DistributedType:  # type: ignore[override]
        return DistributedType.FSDP

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        from torch.distributed.device_mesh import init_device_mesh

        self._mesh = release_mesh_with_groups(
            init_device_mesh(self.root_device.type, (self.world_size,))
        )

    def module_init_context(self) -> contextlib.AbstractContextManager[Any]:
        if self.cpu_ram_efficient_loading and self.global_rank != 0:
            from trainer.big_modeling.api import init_empty_weights

            return init_empty_weights()
        return contextlib.nullcontext()

    def _matches(self, module: torch.nn.Module, classes: Iterable[type | str]) -> bool:
        return any(
            (isinstance(c, str) and type(module).__name__ == c)
            or (isinstance(c, type) and isinstance(module, c))
            for c in classes
        )

    def _layers_to_shard(self, module: torch.nn.Module) -> list[torch.nn.Module]:
        policy = self.auto_wrap_policy
        if not policy:
            return []
        if policy == "size":
            chosen: list[torch.nn.Module] = []
            covered: set[int] = set()
            for sub in reversed(list(module.modules())):  # children before parents
                if sub is module:
                    continue
                own = [p for p in sub.parameters() if id(p) not in covered]
                if sum(p.numel() for p in own) >= self.min_num_params:
                    chosen.append(sub)
                    covered.update(id(p) for p in own)
            return chosen
        return [sub for sub in module.modules() if sub is not module and self._matches(sub, policy)]

    def _apply_activation_checkpointing(self, module: torch.nn.Module) -> None:
        setting = self.activation_checkpointing
        if not setting:
            return
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
        )

        classes = (
            setting
            if not isinstance(setting, bool)
            else (
                self.auto_wrap_policy
                if isinstance(self.auto_wrap_policy, set | list | tuple)
                else None
            )
        )
        if not classes:
            raise ConfigurationError(
                "FSDPStrategy(activation_checkpointing=True) needs layer classes: pass them, or an auto_wrap_policy with layer classes."
            )
        apply_activation_checkpointing(module, check_fn=lambda sub: self._matches(sub, classes))

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Checkpoint activations, shard the chosen layers then the root, load rank 0's weights."""
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            FSDPModule,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        if isinstance(module, FSDPModule):  # sharded by an earlier run: sharding is in place
            append_once(self._sharded, module)
            return module
        full_state = None
        if self.cpu_ram_efficient_loading:
            full_state = (
                {k: v.detach().cpu() for k, v in module.state_dict().items()}
                if self.global_rank == 0
                else {}
            )
        elif not any(p.device.type == "meta" for p in module.parameters()):
            module = module.to(self.root_device if not self.cpu_offload else "cpu")
        self._apply_activation_checkpointing(module)
        compute = self.precision.compute_dtype
        mp_policy = self.mixed_precision_policy or (
            MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
            if compute != torch.float32
            else MixedPrecisionPolicy()
        )
        if (
            self.precision.param_dtype is not None
        ):  # true-half/64 modes: store the params in that dtype
            module = module.to(dtype=self.precision.param_dtype)
        offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
        options = {
            "mesh": self._mesh,
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": mp_policy,
            "offload_policy": offload,
        }
        for layer in self._layers_to_shard(module):
            fully_shard(layer, **options)
        fully_shard(module, **options)
        if full_state is not None:
            self._broadcast_from_rank0(module, full_state)
        append_once(self._sharded, module)
        return module

    def _broadcast_from_rank0(
        self, module: torch.nn.Module, full_state: dict[str, torch.Tensor]
    ) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if any(p.device.type == "meta" for p in module.parameters()) or any(
            b.device.type == "meta" for b in module.buffers()
        ):
            module.to_empty(device=self.root_device if not self.cpu_offload else "cpu")
        set_model_state_dict(
            module,
            full_state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        append_once(self._optimizers, optimizer)  # sharded checkpoints load into these
        return optimizer

    @contextlib.contextmanager
    def no_backward_sync(self, module: torch.nn.Module) -> Iterator[None]:
        """Accumulate unsharded gradients locally; reduce-scatter only on the stepping batch."""
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(module, FSDPModule):
            yield
            return
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    def clip_grad_norm_(
        self,
        module: torch.nn.Module | None,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module  # fully_shard changes the module in place; there is no wrapper

    # ---- state -------------------------------------------------------------------------
    def _owner(self, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for module in self._sharded:
            if any(id(p) in params for p in module.parameters()):
                return module
        raise ConfigurationError(
            "FSDPStrategy: this optimizer's parameters belong to no sharded module; prepare the model before its optimizer."
        )

    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        is_full = full or self.state_dict_type == "FULL"
        return get_model_state_dict(
            module, options=StateDictOptions(full_state_dict=is_full, cpu_offload=is_full)
        )

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        is_full = not any(hasattr(v, "device_mesh") for v in state_dict.values())
        set_model_state_dict(
            module, state_dict, options=StateDictOptions(full_state_dict=is_full, strict=strict)
        )

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        is_full = self.state_dict_type == "FULL"
        return get_optimizer_state_dict(
            self._owner(optimizer),
            optimizer,
            options=StateDictOptions(full_state_dict=is_full, cpu_offload=is_full),
        )

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        is_full = not _has_dtensor(state_dict)
        set_optimizer_state_dict(
            self._owner(optimizer),
            optimizer,
            state_dict,
            options=StateDictOptions(full_state_dict=is_full),
        )

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """FULL: rank 0 writes safetensors. SHARDED: every rank writes DCP shards, rank 0 commits."""
        if self.state_dict_type == "FULL":
            super().save_checkpoint(path, checkpoint)
            return
        save_sharded_checkpoint(self, path, checkpoint)

    @property
    def has_sharded_checkpoints(self) -> bool:
        """Whether every rank writes DCP shards (SHARDED); FULL: rank 0 writes the gathered state."""
        return self.state_dict_type == "SHARDED"

    def start_async_save(
        self,
        path: str | os.PathLike[str],
        checkpoint: dict[str, Any],
        *,
        process_group: ProcessGroup,
        stager: AsyncStager,
    ) -> AsyncShardedSave:
        """SHARDED, in the background: copy this rank's shards, start DCP's ``async_save``.

        Every rank calls it on the training thread (``trainer.plugins.AsyncCheckpointIO``
        does); the checkpoint is committed as `save_checkpoint`'s, from a background thread.

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

        return start_async_sharded_save(
            self, path, checkpoint, process_group=process_group, stager=stager
        )

    def load_checkpoint(
        self, path: str | os.PathLike[str], module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        """Verify, read the JSON state, and load DCP shards into this rank's sharded state."""
        if not has_sharded_state(path):
            return super().load_checkpoint(path, module)  # a FULL (or single-process) checkpoint
        module = module if module is not None else (self._sharded[0] if self._sharded else None)
        return load_sharded_checkpoint(self, path, module, self._optimizers)

    def teardown(self) -> None:
        # Sharding is in place and outlives the run: keep the modules for saves after fit.
        super().teardown()

    def __repr__(self) -> str:
        return f"FSDPStrategy(device={self.root_device}, world_size={self.world_size}, state_dict_type={self.state_dict_type!r}, precision={self.precision.name!r})"


def _has_dtensor(obj: Any) -> bool:
    if hasattr(obj, "device_mesh"):
        return True
    if isinstance(obj, dict):
        return any(_has_dtensor(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_has_dtensor(v) for v in obj)
    return False


def append_once(items: list[Any], item: Any) -> None:
    """Append ``item`` unless that very object is already there."""
    if not any(existing is item for existing in items):
        items.append(item)
