"""DDPStrategy: data parallelism with ``torch.nn.parallel.DistributedDataParallel``.

One process per device, started by torchrun (``trainer launch``) or SLURM; the process group is
NCCL on CUDA and gloo on CPU. Gradients are all-reduced during backward, skipped inside
accumulation windows (``no_sync``). Collectives are ``torch.distributed`` calls.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import gc
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.errors import StrategyError
from trainer.precision import Precision
from trainer.state import DistributedType, PartialState
from trainer.strategies.environment import ClusterEnvironment, detect_environment
from trainer.strategies.strategy import ReduceOp, Strategy

__all__ = ["DDPStrategy"]

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "mean": dist.ReduceOp.SUM,
}


class DDPStrategy(Strategy):
    """Distributed data parallel over all processes of the job.

    Args:
        accelerator: "cpu", "cuda" or None (CUDA when available).
        precision: the Precision plugin (the Accelerator fills it in when None).
        find_unused_parameters: passed to ``DistributedDataParallel``.
        static_graph: passed to ``DistributedDataParallel``.
        gradient_as_bucket_view: passed to ``DistributedDataParallel``.
        bucket_cap_mb: passed to ``DistributedDataParallel``.
        ddp_comm_hook: a gradient communication hook
            (e.g. ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``).
        ddp_comm_state: the state the hook receives.
        process_group_backend: "nccl", "gloo" or None (nccl on CUDA, gloo on CPU).
        timeout: the collective timeout; a rank that waits longer fails instead of hanging.

    Examples:
        >>> Trainer(strategy=DDPStrategy(find_unused_parameters=True), devices=2)
    """

    name = "ddp"

    def __init__(
        self,
        accelerator: str | None = None,
        *,
        precision: Precision | None = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: float | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_state: Any = None,
        process_group_backend: str | None = None,
        timeout: dt.timedelta = dt.timedelta(minutes=30),
        environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(None, precision=precision)
        self.accelerator_type = accelerator or ("cuda" if torch.cuda.is_available() else "cpu")
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_state = ddp_comm_state
        self.process_group_backend = process_group_backend
        self.timeout = timeout
        self.environment = environment or detect_environment()
        self._wrapped: list[DistributedDataParallel] = []

    # ---- facts -------------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:  # type: ignore[override]
        return (
            DistributedType.MULTI_GPU
            if self.accelerator_type == "cuda"
            else DistributedType.MULTI_CPU
        )

    @property
    def root_device(self) -> torch.device:
        if self.accelerator_type == "cuda":
            return torch.device("cuda", self.local_rank % max(1, torch.cuda.device_count()))
        return torch.device(self.accelerator_type)

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else self.environment.world_size

    @property
    def global_rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else self.environment.global_rank

    @property
    def local_rank(self) -> int:
        return self.environment.local_rank

    @property
    def node_rank(self) -> int:
        return self.environment.node_rank

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Join the process group the launcher prepared (or reuse an existing one)."""
        if not dist.is_initialized():
            if not self.environment.is_distributed:
                raise StrategyError(
                    "DDPStrategy: this process was not started by a launcher (no RANK/WORLD_SIZE "
                    "from torchrun, no SLURM task). Start it with `trainer launch --num_processes N "
                    "script.py` or `torchrun --nproc_per_node N script.py`."
                )
            os.environ.setdefault("MASTER_ADDR", self.environment.main_address)
            os.environ.setdefault("MASTER_PORT", str(self.environment.main_port))
            backend = self.process_group_backend or (
                "nccl" if self.accelerator_type == "cuda" else "gloo"
            )
            if self.accelerator_type == "cuda":
                torch.cuda.set_device(self.root_device)
            dist.init_process_group(
                backend,
                rank=self.environment.global_rank,
                world_size=self.environment.world_size,
                timeout=self.timeout,
            )
            atexit.register(_destroy_process_group)
            PartialState._reset_state()
        self.precision.setup(self.root_device)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        module = self.precision.convert_module(module).to(self.root_device)
        if not any(p.requires_grad for p in module.parameters()):
            return module  # nothing to synchronise (e.g. a frozen evaluation model)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        wrapped = DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)
        if self.ddp_comm_hook is not None:
            wrapped.register_comm_hook(self.ddp_comm_state, self.ddp_comm_hook)
        self._wrapped.append(wrapped)
        return wrapped

    @contextlib.contextmanager
    def no_backward_sync(self, module: torch.nn.Module) -> Iterator[None]:
        if isinstance(module, DistributedDataParallel):
            with module.no_sync():
                yield
        else:
            yield

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.module if isinstance(module, DistributedDataParallel) else module

    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        return self.unwrap_module(module).state_dict()

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        self.unwrap_module(module).load_state_dict(state_dict, strict=strict)

    # ---- collectives -------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        if op not in _OPS:
            raise StrategyError(f"all_reduce(op={op!r}): expected one of {sorted(_OPS)}.")
        result = tensor.clone() if tensor.is_floating_point() or op != "mean" else tensor.float()
        dist.all_reduce(result, op=_OPS[op])
        return result / self.world_size if op == "mean" else result

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        pieces = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(pieces, tensor.contiguous())
        return torch.stack(pieces)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if isinstance(obj, torch.Tensor):
            result = obj.clone()
            dist.broadcast(result, src=src)
            return result
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def teardown(self) -> None:
        """Drop the DDP wrappers (the process group ends at exit, after a gc.collect())."""
        self._wrapped.clear()

    def __repr__(self) -> str:
        return f"DDPStrategy(device={self.root_device}, world_size={self.world_size}, precision={self.precision.name!r})"


def _destroy_process_group() -> None:
    """At exit: collect dead wrappers first, then end the group (the order avoids an abort)."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
