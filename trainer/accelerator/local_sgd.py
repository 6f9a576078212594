"""``LocalSGD``: train replicas apart for a few steps, then average their parameters.

Owns the step count and the averaging: inside the context, DDP's gradient all-reduce is
switched off (``Accelerator.no_sync``), each process steps on its own gradients, and every
``local_sgd_steps`` optimizer steps (and on leaving the context) parameters are replaced by
their mean over the processes. Accelerate's ``accelerate.local_sgd.LocalSGD``, same semantics.

Does not own the collectives (``Accelerator.reduce``) nor gradient synchronisation (the
strategy); engines that shard or split parameters (FSDP, DeepSpeed, Megatron) are refused.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError, describe
from trainer.runtime.state import DistributedType

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator

__all__ = ["LocalSGD"]

# Replicated parameters only: every process holds the whole model.
_SUPPORTED = frozenset(
    {DistributedType.NO}
    | {member for member in DistributedType if member.value.startswith("MULTI_")}
)


class LocalSGD:
    """Average parameters across processes every ``local_sgd_steps`` steps instead of gradients.

    Use it around the training loop and call ``step()`` after each optimizer step. With one
    process (or ``enabled=False``) it does nothing, so the same script runs everywhere.

    Args:
        accelerator: the Accelerator that prepared ``model`` (DDP or one process).
        model: the prepared model whose parameters are averaged.
        local_sgd_steps: optimizer steps between two averages, an int >= 1.
        enabled: False turns it off (gradients are then all-reduced as usual).

    Raises:
        ConfigurationError: a strategy that shards or splits parameters (FSDP, DeepSpeed,
            Megatron, XLA), or ``local_sgd_steps`` that is not an int >= 1.

    Examples:
        >>> # 2 processes, batch 4 each: 3 independent steps, then one average
        >>> with LocalSGD(accelerator, model, local_sgd_steps=3) as local_sgd:
        ...     for x, y in loader:
        ...         accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        ...         optimizer.step()
        ...         optimizer.zero_grad()
        ...         local_sgd.step()
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ) -> None:
        kind = accelerator.distributed_type
        if kind not in _SUPPORTED:
            raise ConfigurationError(
                f"LocalSGD: the Accelerator runs {kind} ({type(accelerator.strategy).__name__}), "
                "whose processes do not each hold the whole model. LocalSGD averages replicated "
                "parameters: use DDPStrategy (strategy='ddp') or one process."
            )
        steps = local_sgd_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ConfigurationError(
                f"LocalSGD(local_sgd_steps={describe(local_sgd_steps)}): expected an int >= 1, "
                "e.g. local_sgd_steps=8 (optimizer steps between two averages)."
            )
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and kind != DistributedType.NO
        self.num_steps = 0
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self.enabled:
            return
        try:
            if exc_type is None:  # a failing rank would leave the others waiting in the average
                self._average_parameters()
        finally:
            self._no_sync.__exit__(exc_type, exc, traceback)

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps``."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average_parameters()

    def _average_parameters(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.model.parameters():
                param.copy_(self.accelerator.reduce(param.detach(), reduction="mean"))
