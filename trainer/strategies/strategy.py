"""The Strategy base class: where and how processes and devices run.

The base class is the single-device implementation of every verb (STYLE §c.2). Subclasses
override only what their engine changes, with the same signatures. A strategy receives its
Precision plugin and nothing above it: it knows nothing of the Trainer, callbacks or loggers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from trainer.errors import StrategyError
from trainer.precision import Precision
from trainer.runtime.state import DistributedType

__all__ = ["Strategy"]

ReduceOp = str  # "mean" | "sum" | "max" | "min"

# `Strategy.reduce`'s op names (Lightning's, any case): what each means for `Strategy.all_reduce`
_REDUCE_NAMES = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}


def reduce_op_name(reduce_op: Any) -> ReduceOp:
    """`Strategy.all_reduce`'s op for a ``reduce_op`` of Lightning's ``Strategy.reduce``: a
    name ("mean" or "avg", "sum", "max", "min", in any case) or a ``torch.distributed.ReduceOp``
    member of those (``ReduceOp.SUM``).

    Raises:
        StrategyError: another op (Lightning would pass it to torch).
    """
    if isinstance(reduce_op, str) and reduce_op.lower() in _REDUCE_NAMES:
        return _REDUCE_NAMES[reduce_op.lower()]
    members = getattr(torch.distributed, "ReduceOp", None)
    for name in ("SUM", "AVG", "MAX", "MIN"):
        if members is not None and reduce_op == getattr(members, name):
            return _REDUCE_NAMES[name.lower()]
    raise StrategyError(
        f"Strategy.reduce(reduce_op={reduce_op!r}): expected one of 'mean' (or 'avg'), 'sum', "
        "'max', 'min', or torch.distributed.ReduceOp.SUM / AVG / MAX / MIN; received "
        f"{type(reduce_op).__name__}. Reduce with one of those."
    )


class Strategy:
    """One process on one device. The interface every engine implements.

    Args:
        device: the device to run on ("cpu", "cuda:0", a torch.device); None picks the best
            available (CUDA, then MPS, then CPU).
        precision: the Precision plugin; the Accelerator fills it in when None.
    """

    name: str = "single"
    distributed_type: DistributedType = DistributedType.NO

    def __init__(
        self, device: str | torch.device | None = None, *, precision: Precision | None = None
    ) -> None:
        self._device = torch.device(device) if device is not None else None
        self.precision: Precision = precision if precision is not None else Precision()

    # ---- facts -------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""
        if self._device is None:
            from trainer.runtime.state import default_device

            self._device = default_device(False, self.local_rank)
        return self._device

    @property
    def world_size(self) -> int:
        return 1

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """How the data layer shards: ``num_replicas`` data-parallel ranks, this one's ``rank``."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Start what the engine needs (process group, device selection)."""
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        self.precision.setup(self.root_device)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert the module's dtype, move it to the device, wrap it for the engine."""
        module = self.precision.convert_module(module)
        return module.to(self.root_device)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Adapt an optimizer built on the module's parameters (engines may replace it)."""
        return optimizer

    # ---- training ----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None, **kwargs: Any) -> None:
        """Backpropagate ``loss`` through the precision plugin."""
        self.precision.backward(loss, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer``; False when the precision plugin skipped it."""
        return self.precision.optimizer_step(optimizer)

    @contextlib.contextmanager
    def no_backward_sync(self, module: torch.nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation inside the block (accumulation); no-op on one device."""
        yield

    def clip_grad_norm_(
        self,
        module: torch.nn.Module | None,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Clip the gradients' total norm to ``max_norm``; return the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # ---- collectives (identity on one process) ------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        """Reduce ``tensor`` over all processes with ``op``."""
        return tensor

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        """Lightning's ``Strategy.reduce``: ``tensor`` reduced over the processes (`all_reduce`).

        Args:
            tensor: the tensor to reduce; anything else is returned as it is (as Lightning).
            group: a ``torch.distributed`` process group; None means all processes.
            reduce_op: "mean" (or "avg"), "sum", "max" or "min", in any case, or the
                ``torch.distributed.ReduceOp`` member.

        Returns:
            The reduced tensor, a new one: the input is left as it is (Lightning's reduces it
            in place too). On one process, ``tensor`` itself. Over several processes an integer
            tensor's mean is a float tensor (Lightning's truncates it to the integer dtype).

        Raises:
            StrategyError: an op not listed above.

        Examples:
            >>> # 2 processes holding tensor(1.) and tensor(3.)
            >>> trainer.strategy.reduce(loss, reduce_op="mean")  # tensor(2.) on both
        """
        if not isinstance(tensor, torch.Tensor):
            return tensor
        return self.all_reduce(tensor, reduce_op_name(reduce_op))

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a yes/no across processes: every one says yes (``all``) or any one does.

        The one place "any rank says stop" is decided (early stopping, the LR finder, spike
        detection, preemption); Lightning's name and meaning.
        """
        if self.world_size == 1:
            return bool(decision)
        flag = torch.tensor([float(bool(decision))], device=self.root_device)
        return bool(self.all_reduce(flag, op="min" if all else "max").item())

    def all_gather(
        self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> torch.Tensor:
        """Stack ``tensor`` from every process: shape ``(world_size, *tensor.shape)``.

        Lightning's signature: ``group`` (a ``torch.distributed`` process group, None for all
        processes) and ``sync_grads`` (gradients flow back through the gather) matter with
        several processes. On one process the shape is ``(1, *tensor.shape)`` (Lightning's
        strategy returns ``tensor`` itself; ``TrainModule.all_gather`` does too, as Lightning's).
        """
        return tensor.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Send ``obj`` (a tensor or a picklable object) from process ``src`` to all."""
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        """``obj`` (picklable) from every process, in rank order."""
        return [obj]

    def barrier(self, name: str | None = None) -> None:
        """Wait for every process; ``name`` only labels the barrier (Lightning's signature)."""

    # ---- state -------------------------------------------------------------------------
    def module_init_context(self) -> contextlib.AbstractContextManager[Any]:
        """Where ``configure_model`` builds layers (meta device on ranks that receive weights)."""
        return contextlib.nullcontext()

    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        """The module's state dict: full (gathered) or, where the engine shards, this rank's shard."""
        return module.state_dict()

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        module.load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        optimizer.load_state_dict(state_dict)

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """Write ``checkpoint`` (see trainer/checkpoint) on the main process, atomically."""
        from trainer.checkpoint import write_checkpoint

        if self.is_global_zero:
            write_checkpoint(path, checkpoint, world_size=self.world_size)
        self.barrier()

    def prepare_state_copy(self) -> None:
        """Make the values on the device final before a background save copies them to host
        memory (`trainer.plugins.AsyncCheckpointIO`, every process): XLA runs its pending lazy
        graph; nothing to do here."""

    def load_checkpoint(
        self, path: str | os.PathLike[str], module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        """Read and verify a checkpoint directory on every process (for ``module``'s state)."""
        from trainer.checkpoint import read_checkpoint

        return read_checkpoint(path)

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside whatever wrapper the engine added."""
        return module

    # Whether the prepared state (sharded modules, an engine) holds the process group after a
    # run, so that saving or evaluating after ``fit`` still works: then the group is kept until
    # `end_process_group` is called by ``Accelerator.end_training`` (or the process exits).
    should_keep_process_group: bool = False

    # Whether a forward on one process waits for the others (parameters gathered from shards,
    # tensor-parallel layers, an XLA graph): then every process must run as many forwards, so
    # the Trainer's predict keeps the last round's padding (`trainer.trainer.prepare`).
    forward_needs_all_processes: bool = False

    def teardown(self) -> None:
        """Release what the run prepared (engine wrappers); the process group is left as it is."""

    def end_process_group(self) -> None:
        """End the process group this strategy started (after a barrier); a no-op otherwise.

        Called by the Trainer when a stage ends cleanly (unless `should_keep_process_group`) and
        by ``Accelerator.end_training``. A later stage or collective joins the group again.
        """

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(device={self.root_device}, precision={self.precision.name!r})"
        )
