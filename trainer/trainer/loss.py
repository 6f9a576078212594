"""What ``training_step`` returned, checked; and ``detect_anomaly``'s checks around backward.

The fit loop (`trainer.trainer.fit_loop`) calls these once per batch; each error names the
module, the hook, the epoch and the batch, and the fix. Nothing here steps or calls a hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import AnomalyError, HookResultError

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["anomaly_backward", "check_finite", "describe_place", "loss_of"]


def describe_place(trainer: Trainer, hook: str, batch_idx: int) -> str:
    """``"MyModule.training_step, epoch 0, batch 3"``, for messages."""
    return (
        f"{type(trainer.module).__name__}.{hook}, epoch {trainer.progress.epoch}, batch {batch_idx}"
    )


def loss_of(trainer: Trainer, output: Any, batch_idx: int) -> torch.Tensor | None:
    """The loss in ``training_step``'s result (None skips the batch), checked.

    Raises:
        HookResultError: anything but a scalar Tensor that requires grad, a dict with one
            under "loss", or None.
        AnomalyError: with ``detect_anomaly``, a nan/inf loss.
    """
    if isinstance(output, torch.Tensor):
        loss = output
    elif output is None:
        return None
    elif isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        loss = output["loss"]
    else:
        detail = " without a 'loss' Tensor" if isinstance(output, dict) else ""
        raise HookResultError(
            f"training_step returned {type(output).__name__}{detail}; expected a Tensor, a "
            f'dict with "loss", or None ({describe_place(trainer, "training_step", batch_idx)}). '
            "Return the loss tensor."
        )
    if loss.numel() != 1 or not loss.requires_grad:
        problem = (
            f"of shape {tuple(loss.shape)}" if loss.numel() != 1 else "that does not require grad"
        )
        raise HookResultError(
            f"training_step returned a loss {problem} "
            f"({describe_place(trainer, 'training_step', batch_idx)}). Return one scalar computed "
            "from the model's outputs, outside torch.no_grad() and without .detach()."
        )
    if trainer.detect_anomaly:
        check_finite(loss, describe_place(trainer, "training_step", batch_idx))
    return loss


def check_finite(loss: torch.Tensor, where: str) -> None:
    """Raise `AnomalyError` when ``loss`` is nan or inf (``detect_anomaly``)."""
    if not torch.isfinite(loss).all():
        kind = "nan" if torch.isnan(loss).any() else "inf"
        raise AnomalyError(
            f"detect_anomaly: the loss is {kind} ({where}). Check the inputs, lower the "
            "learning rate, or clip gradients (gradient_clip_val)."
        )


def anomaly_backward(trainer: Trainer, loss: torch.Tensor, **kwargs: Any) -> None:
    """Backward under ``torch.autograd.detect_anomaly``, then check every gradient is finite."""
    where = describe_place(trainer, "training_step", trainer.progress.batch_idx - 1)
    try:
        with torch.autograd.detect_anomaly(check_nan=True):
            trainer.accelerator.backward(loss, **kwargs)
    except RuntimeError as err:
        if "nan" not in str(err).lower():
            raise
        raise AnomalyError(
            f"detect_anomaly: backward produced nan gradients (after training_step, {where}): {err}"
        ) from err
    bad = [
        name
        for name, p in trainer.module.named_parameters()
        if p.grad is not None and not torch.isfinite(p.grad).all()
    ]
    if bad:
        raise AnomalyError(
            f"detect_anomaly: nan/inf gradients in {bad[:5]} after backward of training_step "
            f"({where})."
        )
