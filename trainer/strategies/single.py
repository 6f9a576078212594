"""SingleDeviceStrategy: one process on one device (CPU, one CUDA GPU or MPS)."""

from __future__ import annotations

import torch

from trainer.precision import Precision
from trainer.strategies.environment import ClusterEnvironment, detect_environment
from trainer.strategies.strategy import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """One process, one device: the base behaviour, named.

    It keeps its cluster environment, as the multi-process strategies do: a one-task SLURM job
    given ``Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])`` saves and exits on
    SIGUSR1 without requeueing. The process facts (rank 0 of 1) are this strategy's own.

    Args:
        device: as for `Strategy`.
        precision: as for `Strategy`.
        environment: the launcher's facts and plugin settings; None reads the environment
            variables (`detect_environment`).

    Examples:
        >>> SingleDeviceStrategy("cpu").root_device
        device(type='cpu')
    """

    name = "single"

    def __init__(
        self,
        device: str | torch.device | None = None,
        *,
        precision: Precision | None = None,
        environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(device, precision=precision)
        self.environment = environment if environment is not None else detect_environment()
