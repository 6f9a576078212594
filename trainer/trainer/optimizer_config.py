"""Turn what ``configure_optimizers`` returned into optimizers and scheduler configs.

Accepted (DESIGN §2): an Optimizer; a list/tuple of them; ``([optimizers], [schedulers])``; a dict
``{"optimizer": o, "lr_scheduler": s | {"scheduler": s, "interval", "frequency", "monitor"}}``;
or a list of such dicts. Anything else raises HookResultError naming the hook and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.errors import ConfigurationError, HookResultError, describe

__all__ = ["SchedulerConfig", "parse_optimizer_config", "step_schedulers"]

_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name"}


@dataclass
class SchedulerConfig:
    """One scheduler and when the Trainer steps it."""

    scheduler: Any
    interval: str = "epoch"  # "epoch" or "step"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None

    @property
    def is_plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _fail(where: str, received: Any, detail: str = "") -> HookResultError:
    return HookResultError(
        f"configure_optimizers returned {describe(received)}{detail}; expected an Optimizer, a "
        "list of them, ([optimizers], [schedulers]), or {'optimizer': o, 'lr_scheduler': s} "
        f"({where}). Return e.g. torch.optim.AdamW(self.parameters(), lr=1e-3)."
    )


def _scheduler_config(item: Any, where: str, monitor: str | None = None) -> SchedulerConfig:
    if isinstance(item, dict):
        unknown = set(item) - _SCHEDULER_KEYS
        if "scheduler" not in item or unknown:
            raise HookResultError(
                f"configure_optimizers: the lr_scheduler dict needs the key 'scheduler' and "
                f"accepts only {sorted(_SCHEDULER_KEYS)}; received keys {sorted(item)} ({where})."
            )
        config = SchedulerConfig(**item)
    else:
        config = SchedulerConfig(item, monitor=monitor)
    if not hasattr(config.scheduler, "step") or not hasattr(config.scheduler, "optimizer"):
        raise HookResultError(
            f"configure_optimizers: {describe(config.scheduler)} is not a learning-rate scheduler "
            f"({where}). Use a torch.optim.lr_scheduler class."
        )
    if config.interval not in ("epoch", "step"):
        raise HookResultError(
            f"configure_optimizers: lr_scheduler interval={config.interval!r}; expected 'epoch' "
            f"or 'step' ({where})."
        )
    if not isinstance(config.frequency, int) or config.frequency < 1:
        raise HookResultError(
            f"configure_optimizers: lr_scheduler frequency={describe(config.frequency)}; expected "
            f"an int >= 1 ({where})."
        )
    if config.is_plateau and config.monitor is None:
        raise HookResultError(
            "configure_optimizers: ReduceLROnPlateau needs a metric to watch; return "
            "{'optimizer': o, 'lr_scheduler': {'scheduler': s, 'monitor': 'val/loss'}} "
            f"({where})."
        )
    return config


def parse_optimizer_config(
    returned: Any, where: str
) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Normalise ``configure_optimizers``'s result; ``where`` names the module for messages."""
    if isinstance(returned, torch.optim.Optimizer):
        return [returned], []
    if isinstance(returned, dict):
        if "optimizer" not in returned:
            raise _fail(where, returned, " (a dict without the key 'optimizer')")
        optimizer = returned["optimizer"]
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise _fail(where, optimizer, " under 'optimizer'")
        schedulers = []
        if returned.get("lr_scheduler") is not None:
            schedulers.append(
                _scheduler_config(returned["lr_scheduler"], where, returned.get("monitor"))
            )
        return [optimizer], schedulers
    if isinstance(returned, list | tuple) and returned:
        if all(isinstance(item, dict) for item in returned):
            optimizers, schedulers = [], []
            for item in returned:
                opts, scheds = parse_optimizer_config(item, where)
                optimizers += opts
                schedulers += scheds
            return optimizers, schedulers
        if (
            len(returned) == 2
            and isinstance(returned[0], list | tuple)
            and isinstance(returned[1], list | tuple)
        ):
            optimizers = list(returned[0])
            if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
                raise _fail(where, returned[0], " as the optimizers list")
            return optimizers, [_scheduler_config(s, where) for s in returned[1]]
        if all(isinstance(item, torch.optim.Optimizer) for item in returned):
            return list(returned), []
    raise _fail(where, returned)


def step_schedulers(
    configs: list[SchedulerConfig],
    interval: str,
    count: int,
    metrics: Callable[[], dict[str, Any]],
    *,
    is_plateau: bool | None = None,
    step: Callable[[Any, Any], None] | None = None,
) -> None:
    """Step the schedulers of ``interval`` ("step"/"epoch") whose ``frequency`` divides ``count``.

    Args:
        is_plateau: only the ReduceLROnPlateau ones (True), only the others (False), or all.
        step: ``step(scheduler, metric)``, the module's ``lr_scheduler_step`` hook (default:
            ``scheduler.step()``, or ``scheduler.step(metric)`` for ReduceLROnPlateau).

    ReduceLROnPlateau gets its ``monitor`` value from ``metrics()`` (read only when needed).
    """
    step = step if step is not None else _step
    for config in configs:
        if config.interval != interval or count % config.frequency != 0:
            continue
        if is_plateau is not None and config.is_plateau != is_plateau:
            continue
        if not config.is_plateau:
            step(config.scheduler, None)
            continue
        values = metrics()
        if config.monitor not in values and not config.strict:
            continue  # strict=False: no value this time, no step (Lightning's semantics)
        if config.monitor not in values:
            raise ConfigurationError(
                f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; logged "
                f"metrics: {sorted(values)}. Log it with self.log({config.monitor!r}, ...) or "
                "change 'monitor' in configure_optimizers."
            )
        step(config.scheduler, values[config.monitor])


def _step(scheduler: Any, metric: Any) -> None:
    if metric is None:
        scheduler.step()
    else:
        scheduler.step(metric)
