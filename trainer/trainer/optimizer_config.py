"""Turn what ``configure_optimizers`` returned into optimizers and scheduler configs.

Accepted (DESIGN §2): an Optimizer; a list/tuple of them; ``([optimizers], [schedulers])`` (or
``([optimizers], scheduler)``); a dict ``{"optimizer": o, "lr_scheduler": s | {"scheduler": s,
"interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau"}}``; or a list of such
dicts. As in Lightning, other keys of these dicts are dropped with a warning, and a scheduler must
belong to a returned optimizer. Anything else raises HookResultError naming the hook and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError, HookResultError, describe

__all__ = ["SchedulerConfig", "parse_optimizer_config", "step_schedulers"]

# Lightning's LRSchedulerConfig fields; another key of an lr_scheduler dict is dropped, with a warning
_SCHEDULER_KEYS = {
    "scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau"
}  # fmt: skip
_OPTIMIZER_KEYS = {"optimizer", "lr_scheduler", "monitor"}


@dataclass
class SchedulerConfig:
    """One scheduler and when the Trainer steps it."""

    scheduler: Any
    interval: str = "epoch"  # "epoch" or "step"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None
    # stepped with its monitor's value; configure_optimizers' parsing sets it for a
    # ReduceLROnPlateau unless the dict says otherwise (Lightning's LRSchedulerConfig field)
    reduce_on_plateau: bool = False

    @property
    def is_plateau(self) -> bool:
        """Whether it is stepped with its ``monitor``'s value (``reduce_on_plateau``)."""
        return self.reduce_on_plateau


def _fail(where: str, received: Any, detail: str = "") -> HookResultError:
    return HookResultError(
        f"configure_optimizers returned {describe(received)}{detail}; expected an Optimizer, a "
        "list of them, ([optimizers], [schedulers]), or {'optimizer': o, 'lr_scheduler': s} "
        f"({where}). Return e.g. torch.optim.AdamW(self.parameters(), lr=1e-3)."
    )


def _without_unknown_keys(item: dict[str, Any], known: set[str], what: str, where: str) -> dict:
    """``item`` without keys Lightning does not know; those it warns about, and so do we."""
    unknown = set(item) - known
    if unknown:
        warn_user(
            f"configure_optimizers: the {what} has keys {sorted(unknown)} that are not used; "
            f"known keys are {sorted(known)} ({where}). Remove them.",
            RuntimeWarning,
        )
    return {key: value for key, value in item.items() if key in known}


def _scheduler_config(item: Any, where: str, monitor: str | None = None) -> SchedulerConfig:
    if isinstance(item, dict):
        item = _without_unknown_keys(item, _SCHEDULER_KEYS, "lr_scheduler dict", where)
        if "scheduler" not in item:
            raise HookResultError(
                f"configure_optimizers: the lr_scheduler dict needs the key 'scheduler'; received "
                f"keys {sorted(item)} ({where}). Return {{'scheduler': s, 'interval': 'step'}}."
            )
        config = SchedulerConfig(**item)
        if "reduce_on_plateau" not in item:
            config.reduce_on_plateau = _is_plateau(config.scheduler)
    else:
        config = SchedulerConfig(item, monitor=monitor, reduce_on_plateau=_is_plateau(item))
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


def _is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def parse_optimizer_config(
    returned: Any, where: str
) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Normalise ``configure_optimizers``'s result; ``where`` names the module for messages.

    Raises:
        HookResultError: an unknown shape, a bad scheduler entry, or a scheduler whose optimizer
            was not returned (Lightning refuses it: it would run at a constant learning rate).
    """
    optimizers, schedulers = _parse(returned, where)
    for config in schedulers:
        if not any(config.scheduler.optimizer is optimizer for optimizer in optimizers):
            raise HookResultError(
                f"configure_optimizers: the scheduler {type(config.scheduler).__name__} is "
                "attached to an optimizer that configure_optimizers did not return "
                f"({where}). Build the scheduler on a returned optimizer, or return its optimizer."
            )
    return optimizers, schedulers


def _parse(returned: Any, where: str) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    if isinstance(returned, torch.optim.Optimizer):
        return [returned], []
    if isinstance(returned, dict):
        if "optimizer" not in returned:
            raise _fail(where, returned, " (a dict without the key 'optimizer')")
        returned = _without_unknown_keys(returned, _OPTIMIZER_KEYS, "optimizer dict", where)
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
                opts, scheds = _parse(item, where)
                optimizers += opts
                schedulers += scheds
            return optimizers, schedulers
        if len(returned) == 2 and isinstance(returned[0], list | tuple):
            optimizers = list(returned[0])
            if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
                raise _fail(where, returned[0], " as the optimizers list")
            # ([optimizers], scheduler): one scheduler outside a list, as Lightning takes it
            given = returned[1] if isinstance(returned[1], list | tuple) else [returned[1]]
            return optimizers, [_scheduler_config(s, where) for s in given]
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
