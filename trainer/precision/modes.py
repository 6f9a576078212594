"""The precision modes other than 32-true and fp8: 64-true, the true-half modes, the mixed modes.

Each class is one mode. Mixed modes run the forward pass under ``torch.autocast``; "16-mixed"
scales the loss with ``torch.amp.GradScaler`` and reports skipped steps. True modes ("64-true",
"16-true", "bf16-true") run it with torch's default dtype set to theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainer.errors import ConfigurationError
from trainer.precision.precision import Precision

__all__ = ["DoublePrecision", "HalfPrecision", "MixedPrecision", "default_dtype"]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """``torch.set_default_dtype(dtype)`` inside the block; the previous default after it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class DoublePrecision(Precision):
    """``"64-true"``: parameters, inputs and math in ``float64``; tensors created in a step too."""

    name = "64-true"
    param_dtype = torch.float64
    compute_dtype = torch.float64

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """torch's default dtype is float64 inside the region (as Lightning's ``forward_context``)."""
        return default_dtype(torch.float64)


class HalfPrecision(Precision):
    """``"16-true"`` / ``"bf16-true"``: parameters and inputs stored in half precision.

    No master copy in fp32 and no scaling: the cheapest mode, for fine-tuning and inference.
    """

    def __init__(self, precision: str = "bf16-true") -> None:
        if precision not in ("16-true", "bf16-true"):
            raise ConfigurationError(
                f"HalfPrecision(precision={precision!r}): expected '16-true' or 'bf16-true'."
            )
        self.name = precision
        self.param_dtype = torch.float16 if precision == "16-true" else torch.bfloat16
        self.compute_dtype = self.param_dtype
        self.mixed_precision = "fp16" if precision == "16-true" else "bf16"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """torch's default dtype is the half dtype inside the region, so a tensor the step
        creates (``torch.zeros(n)``, ``torch.tensor(0.5)``) meets the parameters in their dtype,
        as under Lightning's ``forward_context``."""
        return default_dtype(self.param_dtype)


class MixedPrecision(Precision):
    """``"16-mixed"`` / ``"bf16-mixed"``: fp32 parameters, the forward pass under autocast.

    "16-mixed" scales the loss with ``torch.amp.GradScaler``; when a step has inf/NaN gradients the
    scaler skips it, `optimizer_step` returns False and the scale is halved.

    Args:
        precision: "16-mixed" or "bf16-mixed".
        scaler: a ready ``torch.amp.GradScaler`` for "16-mixed" (None: built in `setup`).
        scaler_kwargs: ``torch.amp.GradScaler`` arguments for the one built in `setup`.
        autocast_kwargs: extra ``torch.autocast`` arguments (``enabled``, ``cache_enabled``).
    """

    def __init__(
        self,
        precision: str = "bf16-mixed",
        scaler: Any | None = None,
        *,
        scaler_kwargs: dict[str, Any] | None = None,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if precision not in ("16-mixed", "bf16-mixed"):
            raise ConfigurationError(
                f"MixedPrecision(precision={precision!r}): expected '16-mixed' or 'bf16-mixed'."
            )
        self.name = precision
        self.compute_dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
        self.mixed_precision = "fp16" if precision == "16-mixed" else "bf16"
        self.scaler = scaler
        self.scaler_kwargs = dict(scaler_kwargs or {})
        self.autocast_kwargs = dict(autocast_kwargs or {})
        self.device_type = "cpu"

    def setup(self, device: torch.device) -> None:
        self.device_type = device.type
        if self.name == "16-mixed" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(device.type, **self.scaler_kwargs)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.compute_dtype, **self.autocast_kwargs)

    def backward(
        self,
        loss: torch.Tensor,
        backward_fn: Callable[..., None] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        (backward_fn or torch.Tensor.backward)(loss, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            # GradScaler remembers unscaled optimizers; a second call in one step would raise.
            # GradScaler has no public query for it.
            state = self.scaler._per_optimizer_states[id(optimizer)]  # noqa: SLF001
            if state["stage"].name != "UNSCALED":
                self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        if self.scaler is None:
            optimizer.step()
            return True
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale_before

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state_dict:
            self.scaler.load_state_dict(state_dict["scaler"])
