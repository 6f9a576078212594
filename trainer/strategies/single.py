"""SingleDeviceStrategy: one process on one device (CPU, one CUDA GPU or MPS)."""

from __future__ import annotations

from trainer.strategies.strategy import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """One process, one device: the base behaviour, named.

    Examples:
        >>> SingleDeviceStrategy("cpu").root_device
        device(type='cpu')
    """

    name = "single"
