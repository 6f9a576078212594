"""Check a saved optimizer state against the optimizer it is loaded into, before loading.

``torch.optim.Optimizer.load_state_dict`` takes hyperparameters and buffers as they come: a
momentum buffer of another shape, or ``lr: "fast"``, loads without a word and fails (or turns
the weights to NaN) steps later, deep inside ``optimizer.step``. A checkpoint is data from
wherever it came from, so `check_optimizer_state` compares it with the optimizer first: each
numeric hyperparameter of the optimizer's class must be saved (else the state is another
optimizer class's), each hyperparameter the optimizer holds as a number, a flag or a tuple of
numbers must be saved as the same kind (numbers finite; a flag may be None), and the
per-parameter buffers torch's optimizers keep in the parameter's shape must have that shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer.errors import CheckpointError, describe

__all__ = ["check_optimizer_state"]

# Buffers torch.optim keeps in each parameter's shape (SGD, Adam(W), RMSprop, Adagrad, Adadelta,
# ASGD, NAdam, RAdam, Adamax, Rprop). Others (Adafactor's factored rows, a scalar ``step``) vary.
_SHAPED_BUFFERS = frozenset(
    {
        "momentum_buffer",
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "square_avg",
        "grad_avg",
        "acc_delta",
        "sum",
        "ax",
        "exp_inf",
        "prev",
        "step_size",
    }
)


def check_optimizer_state(optimizer: Any, state: Any, source: str | Path, index: int) -> None:
    """Refuse ``state`` (a saved ``optimizer.state_dict()``) that does not fit ``optimizer``.

    Args:
        optimizer: the torch optimizer, or a wrapper with an ``optimizer`` attribute.
        state: the saved state dict.
        source: where it comes from, for messages.
        index: its position among the saved optimizer states, for messages.

    Raises:
        CheckpointError: a hyperparameter missing (a state of another optimizer class), of
            another kind or not finite, or a buffer whose shape differs from its parameter's,
            naming ``source`` and the field.
    """
    optimizer = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(state, Mapping):
        return  # another object's own load_state_dict judges (load_state_into names it)
    saved_groups = state.get("param_groups")
    if not isinstance(saved_groups, Sequence):
        return
    where = f"{source}: optimizer_states[{index}]"
    saved_buffers = state.get("state")
    for number, (group, saved) in enumerate(
        zip(optimizer.param_groups, saved_groups, strict=False)
    ):
        if not isinstance(saved, Mapping):
            continue
        _check_same_kind(optimizer, saved, f"{where}.param_groups[{number}]")
        for key, current in group.items():
            if key != "params" and key in saved:
                _check_value(current, saved[key], f"{where}.param_groups[{number}].{key}")
        # Shapes are compared only for a plain single-process optimizer: under tensor
        # parallelism or ZeRO, saved buffers are in the global shape and parameters are shards.
        is_plain = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        if (
            is_plain
            and isinstance(saved_buffers, Mapping)
            and isinstance(saved.get("params"), Sequence)
        ):
            for saved_id, parameter in zip(saved["params"], group["params"], strict=False):
                buffers = saved_buffers.get(saved_id)
                if isinstance(buffers, Mapping):
                    _check_shapes(buffers, parameter, f"{where}.state[{saved_id!r}]")


def _check_same_kind(
    optimizer: torch.optim.Optimizer, saved: Mapping[str, Any], field: str
) -> None:
    """The saved group holds every numeric hyperparameter of the optimizer's class.

    ``load_state_dict`` replaces the groups with the saved ones, so a state saved by another
    class fails later with a bare KeyError: SGD's into Adam on load (``'step'``), Adam's into
    SGD at the first step (``'momentum'``). A state dict does not record its class, so the
    hyperparameter names tell. Flags (True, False, None) are left out: a state saved by an
    older torch lacks the ones added since, and the optimizer adds them when it loads.
    """
    missing = [
        key
        for key, value in optimizer.defaults.items()
        if key not in saved and (_is_finite_number(value) or _is_numbers(value))
    ]
    if missing:
        name = type(optimizer).__name__
        held = sorted(key for key in saved if key != "params")
        raise CheckpointError(
            f"{field} does not match {name}'s: it lacks {name}'s hyperparameters {missing} "
            f"and holds {held}. The optimizer state was saved with another optimizer class "
            "(the checkpoint does not record which). Resume with the optimizer it was saved "
            "with, or load the model weights alone."
        )


def _check_value(current: Any, saved: Any, field: str) -> None:
    """``saved`` must be the kind of value ``current`` is (a flag, a number, numbers)."""
    if isinstance(current, bool):
        if saved is not None and not isinstance(saved, bool):
            _refuse(field, saved, "True, False or None")
    elif isinstance(current, int | float):
        if not _is_finite_number(saved):
            _refuse(field, saved, "a finite number")
    elif _is_numbers(current):
        if (
            not isinstance(saved, tuple | list)
            or len(saved) != len(current)
            or not all(_is_finite_number(v) for v in saved)
        ):
            _refuse(field, saved, f"{len(current)} finite numbers")


def _check_shapes(buffers: Mapping[str, Any], parameter: torch.Tensor, field: str) -> None:
    if hasattr(parameter, "device_mesh"):  # a DTensor: its engine checks its own layout
        return
    for name, buffer in buffers.items():
        if name in _SHAPED_BUFFERS and isinstance(buffer, torch.Tensor):
            if buffer.shape != parameter.shape:
                raise CheckpointError(
                    f"{field}.{name} has shape {tuple(buffer.shape)}, but its parameter has "
                    f"{tuple(parameter.shape)}: the checkpoint was written for another model "
                    "or edited. Resume from a checkpoint of this model."
                )


def _is_numbers(value: Any) -> bool:
    """A tuple or list of finite numbers (``betas``)."""
    return isinstance(value, tuple | list) and all(_is_finite_number(v) for v in value)


def _is_finite_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and bool(torch.isfinite(value).all())
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _refuse(field: str, value: Any, expected: str) -> None:
    raise CheckpointError(
        f"{field} is {describe(value)}; the optimizer expects {expected}. The checkpoint was "
        "edited or written by another program: resume from another one."
    )
