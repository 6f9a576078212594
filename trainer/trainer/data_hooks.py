"""Lightning's batch-transfer hooks: ``on_before_batch_transfer``, ``transfer_batch_to_device``
and ``on_after_batch_transfer``, on a TrainModule or a DataModule.

Each batch of every stage (train, validation, test, predict, the sanity check) goes: the
precision plugin's input cast -> ``on_before_batch_transfer(batch, dataloader_idx)`` (still on
the host) -> ``transfer_batch_to_device(batch, device, dataloader_idx)`` -> ``on_after_batch_transfer
(batch, dataloader_idx)`` (on the device), as in Lightning 2.6, just before the batch's first hook.
A DataModule's override wins over the module's (a warning when both override one), as in
Lightning. With no override anywhere nothing changes: the prepared loader moves the batch itself
and no hook is called (the hot path keeps its cost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer._warnings import warn_user
from trainer.data.transfer import send_to_device
from trainer.trainer.log_refusal import refusing_logs

__all__ = ["TRANSFER_HOOKS", "DataHooks", "batch_transfer"]

TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


class DataHooks:
    """The batch-transfer hooks' defaults, for `trainer.TrainModule` and `trainer.DataModule`."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch on the host, before it moves to the device (returns the batch)."""
        return batch

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """Move the batch to ``device``: every tensor in dicts, lists, tuples and namedtuples,
        and anything with a ``.to`` method. Override for a custom batch type (and call
        ``super().transfer_batch_to_device`` for the rest)."""
        return send_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch on the device (augmentations on the GPU; returns the batch)."""
        return batch


def _overrides(obj: object | None, name: str) -> bool:
    if obj is None:
        return False
    return name in vars(obj) or getattr(type(obj), name, None) is not getattr(DataHooks, name)


def _owner(name: str, module: object, datamodule: object | None) -> Any:
    """Whose hook ``name`` runs: the DataModule's when it overrides it, else the module's."""
    if _overrides(datamodule, name):
        if _overrides(module, name):
            warn_user(
                f"{name} is overridden in both {type(module).__name__} and "
                f"{type(datamodule).__name__}: the DataModule's runs (as in Lightning)."
            )
        return datamodule
    return module


def batch_transfer(
    module: object, datamodule: object | None, device: torch.device, dataloader_idx: int
) -> Callable[[Any], Any] | None:
    """What a batch of loader ``dataloader_idx`` goes through, or None when neither ``module``
    nor ``datamodule`` overrides a transfer hook (the loader then moves batches itself)."""
    if not any(_overrides(module, n) or _overrides(datamodule, n) for n in TRANSFER_HOOKS):
        return None
    before, move, after = (getattr(_owner(n, module, datamodule), n) for n in TRANSFER_HOOKS)
    if hasattr(module, "metric_store"):  # self.log raises in them, as in Lightning
        before, move, after = (
            refusing_logs(hook, module, name)
            for hook, name in zip((before, move, after), TRANSFER_HOOKS, strict=True)
        )

    def transfer(batch: Any) -> Any:
        batch = before(batch, dataloader_idx)
        batch = move(batch, device, dataloader_idx)
        return after(batch, dataloader_idx)

    return transfer
