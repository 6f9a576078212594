"""The Accelerator's process verbs: who this process is, collectives, and running code on some processes.

`ProcessAPI` is the base of `trainer.accelerator.Accelerator`: the facts about the processes
(``process_index``, ``num_processes``, ``is_main_process`` ...), the collectives over them
(``gather``, ``gather_for_metrics``, ``reduce``, ``broadcast``, ``pad_across_processes``) and
control (``wait_for_everyone``, ``split_between_processes``, ``main_process_first``, the
``on_*_process`` decorators, ``set_trigger`` / ``check_trigger``, ``trigger_sync_in_backward``,
``join_uneven_inputs``).
Everything delegates to the Strategy (``trainer.accelerator.collectives``) or to
``PartialState``; nothing here prepares, trains or saves.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer.accelerator import collectives, triggers
from trainer.accelerator.decorators import checked_index, run_only_where
from trainer.data.sharding import BatchSamplerShard

if TYPE_CHECKING:
    from trainer.runtime.gradient_state import GradientState
    from trainer.runtime.state import DistributedType, PartialState
    from trainer.strategies import Strategy

__all__ = ["ProcessAPI"]


class ProcessAPI:
    """Accelerate's process facts, collectives and process control, over ``self.strategy``."""

    strategy: Strategy  # set by the Accelerator's constructor
    state: PartialState
    gradient_state: GradientState
    flag_tensor: torch.Tensor | None = None  # set_trigger's flag (Accelerate's attribute)
    _dataloaders: list[Any]  # the prepared dataloaders (the Accelerator's)

    # ---- facts ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.strategy.root_device

    @property
    def process_index(self) -> int:
        return self.strategy.global_rank

    @property
    def local_process_index(self) -> int:
        return self.strategy.local_rank

    @property
    def num_processes(self) -> int:
        return self.strategy.world_size

    @property
    def is_main_process(self) -> bool:
        return self.strategy.global_rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.strategy.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def distributed_type(self) -> DistributedType:
        return self.strategy.distributed_type

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    # ---- collectives --------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nest of them) from every process along dim 0.

        0-dim tensors become shape ``(num_processes,)``.
        """
        return collectives.gather(self.strategy, tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for metric computation, dropping the samples ``even_batches`` duplicated.

        With 2 processes, batch size 5 and 9 samples, the last gathered batch holds 10 rows of
        which the last one repeats the first sample; it is dropped so the metric sees 9.
        """
        return collectives.gather_for_metrics(
            self.strategy, self.gradient_state, input_data, use_gather_object=use_gather_object
        )

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce ``tensor`` (or a nest) over processes: "sum", "mean", "max", "min" or "none".

        With 2 processes holding ``[1, 2]`` and ``[3, 4]``: "sum" gives ``[4, 6]``, "max"
        ``[3, 4]``, "min" ``[1, 2]`` on both; "none" returns ``tensor``. ``scale`` multiplies
        the result.
        """
        return collectives.reduce(self.strategy, tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` along ``dim`` to the largest size on any process, so it can be gathered."""
        return collectives.pad_across_processes(self.strategy, tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Give every process the value of ``tensor`` (or a nest) on ``from_process``."""
        return collectives.broadcast(self.strategy, tensor, from_process)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        self.strategy.barrier()

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """Context manager giving each process its slice of ``inputs`` (see PartialState)."""
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first (e.g. to download or preprocess once)."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each machine's main process first."""
        return self.state.local_main_process_first()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (on the local main process)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    # ---- decorators: the function runs on one process, returns None elsewhere -------------
    # With one process every one of them runs the function, as in Accelerate.
    def on_main_process(self, function: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the main process only (returns None elsewhere).

        Examples:
            >>> @accelerator.on_main_process
            ... def save_report(): ...
        """
        return run_only_where(function, lambda: self.is_main_process, "on_main_process")

    def on_local_main_process(
        self, function: Callable[..., Any] | None = None
    ) -> Callable[..., Any]:
        """Decorator: run ``function`` on each machine's main process only."""
        return run_only_where(function, lambda: self.is_local_main_process, "on_local_main_process")

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` on the last process only (``num_processes - 1``)."""
        return run_only_where(function, lambda: self.is_last_process, "on_last_process")

    def on_process(
        self, function: Callable[..., Any] | None = None, process_index: int | None = None
    ) -> Callable[..., Any]:
        """Decorator: run ``function`` on the process ``process_index`` only.

        Examples:
            >>> @accelerator.on_process(process_index=1)
            ... def report(): ...
        """
        if function is None and process_index is not None:
            return functools.partial(self.on_process, process_index=process_index)
        index = checked_index("on_process", "process_index", process_index)
        return run_only_where(
            function,
            lambda: self.num_processes == 1 or self.process_index == index,
            "on_process",
        )

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Callable[..., Any]:
        """Decorator: run ``function`` on the process ``local_process_index`` of each machine."""
        if function is None and local_process_index is not None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        index = checked_index("on_local_process", "local_process_index", local_process_index)
        return run_only_where(
            function,
            lambda: self.num_processes == 1 or self.local_process_index == index,
            "on_local_process",
        )

    # ---- triggers: any process raises a flag, every process sees it -----------------------
    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger` on every process returns True."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Whether any process called `set_trigger` since the last check; then lower every flag.

        A collective: call it on every process at the same point, e.g. once per step.

        Examples:
            >>> if not torch.isfinite(loss):
            ...     accelerator.set_trigger()
            >>> if accelerator.check_trigger():
            ...     break
        """
        is_raised = self.flag_tensor is not None and bool(self.flag_tensor.item())
        is_set = self.strategy.reduce_boolean_decision(is_raised, all=False)  # any process
        if is_set or self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        return is_set

    trigger_sync_in_backward = staticmethod(triggers.trigger_sync_in_backward)

    # ---- uneven inputs ------------------------------------------------------------------
    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Inside the block, processes may run different numbers of batches: torch's
        ``torch.distributed.algorithms.join.Join`` over ``joinables`` (the prepared DDP model,
        a ``ZeroRedundancyOptimizer``) shadows the collectives of the processes that ran out.

        Args:
            joinables: the ``Joinable`` objects, e.g. ``[model]`` as ``prepare`` returned it.
            even_batches: overrides the prepared dataloaders' ``even_batches`` inside the block
                (``False``: no sample is repeated, so the processes get uneven batch counts).

        Join is enabled when the loaders' ``even_batches`` is False and several processes run;
        with one process the block runs as is. Unlike Accelerate's, it also works over gloo
        (CPU processes): Accelerate does nothing there but warn.

        Examples:
            >>> with accelerator.join_uneven_inputs([model], even_batches=False):
            ...     for x, y in loader:
            ...         accelerator.backward(loss_fn(model(x), y))
            ...         optimizer.step()
            ...         optimizer.zero_grad()
        """
        if self.num_processes == 1:
            yield
            return
        from torch.distributed.algorithms.join import Join

        overridden = []
        if even_batches is not None:
            for loader in self._dataloaders:
                sampler = getattr(loader, "batch_sampler", None)
                if isinstance(sampler, BatchSamplerShard):
                    overridden.append((sampler, sampler.even_batches))
                    sampler.even_batches = even_batches
        is_even = self.even_batches if even_batches is None else even_batches  # type: ignore[attr-defined]
        try:
            with Join(joinables, enable=not is_even, throw_on_early_termination=False):
                yield
        finally:
            for sampler, value in overridden:
                sampler.even_batches = value
