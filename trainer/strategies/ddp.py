"""DDPStrategy: data parallelism with ``torch.nn.parallel.DistributedDataParallel``.

One process per device, started by torchrun (``trainer launch``) or SLURM; the process group is
NCCL on CUDA and gloo on CPU. Gradients are all-reduced during backward, skipped inside
accumulation windows (``no_sync``). Collectives are ``torch.distributed`` calls.

The group this strategy starts is ended by `DDPStrategy.end_process_group` — a barrier, then
``destroy_process_group`` — while the interpreter is fully alive: the Trainer calls it when a
stage ends cleanly, ``Accelerator.end_training`` calls it. Ending it at interpreter exit instead,
with engine objects still alive, can abort the process ("terminate called without an active
exception"): gloo's worker threads then free tensors after Python has gone. An exit hook remains
only as the fallback for a run that failed or never called ``end_training``.

After a failure the wait is bounded: `bound_collective_timeout` (called when ``fit`` raises on a
process) lowers every group's timeout to `FAILURE_TIMEOUT`, so a collective in an
``on_exception`` hook that the other ranks never join fails within seconds, not the group's
30 minutes, and the launcher can stop the job.

Ending the group only frees it if nothing else holds it; what keeps the groups from outliving
the interpreter (and what the exit hook does) is `trainer.strategies.group_lifetime`'s. A
strategy refers to the group it started only weakly (a Trainer kept after ``fit`` keeps its
strategy).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import itertools
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.errors import StrategyError
from trainer.precision import Precision
from trainer.runtime.state import DistributedType, PartialState
from trainer.strategies.environment import ClusterEnvironment, detect_environment
from trainer.strategies.group_lifetime import (
    destroy_default_group,
    hold_no_group_in_default_arguments,
    register_exit_fallback,
    release_group_holders,
    track_wrapper,
)
from trainer.strategies.strategy import ReduceOp, Strategy, reduce_op_name
from trainer.utilities import rank_zero_only

__all__ = [
    "FAILURE_TIMEOUT",
    "REDUCE_OPS",
    "DDPStrategy",
    "bound_collective_timeout",
    "on_backend_device",
]

_JOIN_COUNT = itertools.count()
# How long a collective may wait once this process failed (see `bound_collective_timeout`).
FAILURE_TIMEOUT = dt.timedelta(seconds=30)

# all_reduce's op names; "mean" is a sum divided by the world size afterwards
REDUCE_OPS = {
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
        broadcast_buffers: passed to ``DistributedDataParallel`` when given (False: rank-local
            buffers; torch deprecates passing it at all).
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
        broadcast_buffers: bool | None = None,
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
        if broadcast_buffers is not None:
            self.ddp_kwargs["broadcast_buffers"] = broadcast_buffers
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_state = ddp_comm_state
        self.process_group_backend = process_group_backend
        self.timeout = timeout
        self.environment = environment or detect_environment()
        self._wrapped: list[DistributedDataParallel] = []
        self._dropped: list[weakref.ref[DistributedDataParallel]] = []
        # The default group, when this strategy started it; weak, so that a strategy that outlives
        # its run (its Trainer kept, or reachable from an engine) does not keep an ended group alive.
        self._own_group: weakref.ref[Any] | None = None

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

    @property
    def num_processes(self) -> int:
        """Processes on this machine (Lightning's ``len(parallel_devices)``): torchrun's
        ``LOCAL_WORLD_SIZE``, else the world size over SLURM's node count."""
        local = os.environ.get("LOCAL_WORLD_SIZE")
        if local:
            return int(local)
        return max(1, self.world_size // max(1, int(os.environ.get("SLURM_NNODES", 1))))

    @property
    def num_nodes(self) -> int:
        """Machines in the job (Lightning's): the world size over the processes per machine."""
        return max(1, self.world_size // self.num_processes)

    @property
    def parallel_devices(self) -> list[torch.device]:
        """This machine's devices, one per process (Lightning's): ``cuda:0``… or ``cpu``…."""
        if self.accelerator_type == "cuda":
            return [torch.device("cuda", index) for index in range(self.num_processes)]
        return [torch.device(self.accelerator_type)] * self.num_processes

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Join the process group the launcher prepared (or reuse an existing one).

        Sets ``trainer.utilities.rank_zero_only.rank`` to this process's global rank, as
        Lightning's strategies do: every engine built on this one (and the Trainer through its
        Accelerator) comes here.
        """
        self._join_process_group()
        self.process_group_backend = dist.get_backend()  # the one in use, as Lightning reports
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        self.precision.setup(self.root_device)

    def _join_process_group(self) -> None:
        """Start this process's group from the launcher's environment, unless one exists."""
        if dist.is_initialized():
            return
        if self.environment.source == "none":  # torchrun --nproc_per_node 1: a group of one
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
        hold_no_group_in_default_arguments()
        store, rank, world_size = next(
            dist.rendezvous(
                "env://",
                rank=self.environment.global_rank,
                world_size=self.environment.world_size,
                timeout=self.timeout,
            )
        )
        # A group joined again after `end_process_group` must not read the addresses the ended
        # one left in the launcher's store (torch names every first group alike): one key prefix
        # per join. Every rank joins the same number of times, so the prefixes agree. torchrun
        # keeps its store across the restarts of `--max_restarts`: the attempt is in it too.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefix = f"trainer/{attempt}/{next(_JOIN_COUNT)}"
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(prefix, store),
            rank=rank,
            world_size=world_size,
            timeout=self.timeout,
        )
        self._adopt_process_group()

    def _start_or_join_process_group(self) -> None:
        """Join the launcher's process group; with no launcher, start a one-process group.

        For engines that need ``torch.distributed`` even on one process (DeepSpeed; model-parallel
        layers call collectives over groups of size 1), so a plain ``python script.py`` works.
        """
        if not dist.is_initialized() and not self.environment.is_distributed:
            self._start_single_process_group()
        DDPStrategy.setup_environment(self)

    def _start_single_process_group(self) -> None:
        """A one-process group with an in-memory store, owned (and ended) by this strategy."""
        backend = self.process_group_backend or (
            "nccl" if self.accelerator_type == "cuda" else "gloo"
        )
        if self.accelerator_type == "cuda":
            torch.cuda.set_device(self.root_device)
        hold_no_group_in_default_arguments()
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=self.timeout
        )
        self._adopt_process_group()

    def _adopt_process_group(self) -> None:
        """Record that this strategy started the group (it ends it); forget cached facts."""
        self._own_group = weakref.ref(dist.group.WORLD)
        register_exit_fallback()
        PartialState.reset_state()

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        self._join_process_group()  # an earlier stage may have ended it
        module = self.precision.convert_module(module).to(self.root_device)
        if not any(p.requires_grad for p in module.parameters()):
            return module  # nothing to synchronise (e.g. a frozen evaluation model)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        wrapped = DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)
        if self.ddp_comm_hook is not None:
            wrapped.register_comm_hook(self.ddp_comm_state, self.ddp_comm_hook)
        self._wrapped.append(wrapped)
        return track_wrapper(wrapped)

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
    def _on_group_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` where the group's backend can send it: NCCL sends CUDA tensors only.

        Host tensors (a shuffle seed, a metric computed on the CPU) go through this process's
        GPU and come back to the host; gloo sends host and CUDA tensors as they are.
        """
        return on_backend_device(tensor, self.root_device)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        return self._all_reduce(tensor, op, None)

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        if group is None or not isinstance(tensor, torch.Tensor):
            return super().reduce(tensor, reduce_op=reduce_op)  # engines' own `all_reduce`
        return self._all_reduce(tensor, reduce_op_name(reduce_op), group)

    def _all_reduce(self, tensor: torch.Tensor, op: ReduceOp, group: Any | None) -> torch.Tensor:
        """``tensor`` reduced over ``group`` (None: all processes), a new tensor."""
        if op not in REDUCE_OPS:
            raise StrategyError(f"all_reduce(op={op!r}): expected one of {sorted(REDUCE_OPS)}.")
        self._join_process_group()
        result = tensor.clone() if tensor.is_floating_point() or op != "mean" else tensor.float()
        sent = self._on_group_device(result)
        dist.all_reduce(sent, op=REDUCE_OPS[op], group=group)
        result = sent.to(tensor.device)
        return result / dist.get_world_size(group) if op == "mean" else result

    def all_gather(
        self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> torch.Tensor:
        self._join_process_group()
        sent = self._on_group_device(tensor.contiguous())
        if sync_grads:  # torch's differentiable gather: each piece's gradient goes back to its rank
            from torch.distributed.nn.functional import all_gather

            pieces = list(all_gather(sent, group=group or dist.group.WORLD))
        else:
            pieces = [torch.empty_like(sent) for _ in range(dist.get_world_size(group))]
            dist.all_gather(pieces, sent, group=group)
        return torch.stack(pieces).to(tensor.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self._join_process_group()
        if isinstance(obj, torch.Tensor):
            result = self._on_group_device(obj.clone())
            dist.broadcast(result, src=src)
            return result.to(obj.device)
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        self._join_process_group()
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self, name: str | None = None) -> None:
        self._join_process_group()
        dist.barrier()

    def teardown(self) -> None:
        """Drop the DDP wrappers (each run wraps the module afresh); keep the process group."""
        self._dropped = [weakref.ref(wrapper) for wrapper in self._wrapped]
        self._wrapped.clear()

    def end_process_group(self) -> None:
        """Barrier, then destroy the group this strategy started; the next use joins again.

        A dropped DDP wrapper still alive in a reference cycle holds the group's pending work:
        it is collected first, only when one is (a collection costs ~0.1-1 s with big imports).
        """
        own_group = self._own_group() if self._own_group is not None else None
        if not dist.is_initialized() or dist.group.WORLD is not own_group:
            return  # not started here (a user's group, another Trainer's), or already ended
        if any(ref() is not None for ref in self._dropped):
            gc.collect()
        self._dropped = []
        dist.barrier()
        release_group_holders()
        destroy_default_group()
        self._own_group = None
        PartialState.reset_state()

    def __repr__(self) -> str:
        return f"DDPStrategy(device={self.root_device}, world_size={self.world_size}, precision={self.precision.name!r})"


def bound_collective_timeout(timeout: dt.timedelta = FAILURE_TIMEOUT) -> bool:
    """Make every collective of this process wait at most ``timeout`` from now on.

    For a process whose ``fit`` raised while the other ranks still train: they wait in a step's
    collective, so one started by an ``on_exception`` hook (``OnExceptionCheckpoint``'s save)
    would never complete and, with the group's own timeout (30 minutes), keep the whole job
    running. Bounded, it fails after ``timeout``, the process exits, and the launcher stops the
    other ranks. Only lowers: a group whose timeout is already shorter keeps it. The process
    groups' timeouts are set through torch's private ``_set_default_timeout``.

    Returns:
        Whether a process group was there to bound.
    """
    if not dist.is_available() or not dist.is_initialized():
        return False
    # torch has no public API to list the groups or change a backend's timeout.
    groups = list(getattr(dist.distributed_c10d._world, "pg_map", {})) or [dist.group.WORLD]  # noqa: SLF001
    for group in groups:
        for device in getattr(group, "_device_types", []):
            try:
                backend = group._get_backend(device)  # noqa: SLF001
                current = backend.options._timeout  # noqa: SLF001
                if current > timeout:
                    backend._set_default_timeout(timeout)  # noqa: SLF001
            except (AttributeError, RuntimeError):  # a backend without a settable timeout
                continue
    return True


def on_backend_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor moved to ``device`` when the default group is NCCL's (CUDA tensors only)."""
    if tensor.device.type == "cpu" and dist.get_backend() == "nccl":
        return tensor.to(device)
    return tensor
