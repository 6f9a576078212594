"""Lightning's opt-out defaults of the Trainer's switches: None is the default, and
``barebones=True`` turns everything that costs speed off.

The switches are ``logger``, ``enable_progress_bar``, ``enable_model_summary``,
``enable_checkpointing`` and ``log_every_n_steps``; a project ported from Lightning passes None
for any of them (``logger=wandb if use_wandb else None``) and gets the default there.
"""

from __future__ import annotations

from typing import Any

from trainer.errors import ConfigurationError, describe
from trainer.trainer.options import check_positive_int

__all__ = ["DEFAULT_LOG_EVERY_N_STEPS", "check_log_interval", "default_switches"]

DEFAULT_LOG_EVERY_N_STEPS = 50


def _check_barebones_profiler(profiler: Any) -> None:
    """``barebones=True`` turns profiling off: a profiler passed with it is a contradiction."""
    if profiler is not None:
        raise ConfigurationError(
            f"Trainer(barebones=True, profiler={describe(profiler)}): barebones mode turns "
            "profiling off, as in Lightning. Drop barebones=True to profile, or drop profiler."
        )


def default_switches(
    barebones: bool,
    profiler: Any,
    logger: Any,
    *switches: bool | None,
) -> tuple[Any, ...]:
    """``logger`` and the ``enable_*`` switches with Lightning's opt-out defaults: None is the
    default (the CSVLogger; on), and ``barebones=True`` turns every one off."""
    if barebones:  # Lightning's: everything that costs speed is off
        _check_barebones_profiler(profiler)
        return (False, *(False for _ in switches))
    return (True if logger is None else logger, *(True if s is None else s for s in switches))


def check_log_interval(value: int | None) -> int:
    """``log_every_n_steps``: an int >= 0; None is the default, 50. 0 writes no training step
    rows (epoch rows still go out), and the callbacks that log on the same schedule
    (LearningRateMonitor, DeviceStatsMonitor, ThroughputMonitor) log nothing per step, as
    Lightning."""
    return check_positive_int(
        "log_every_n_steps",
        DEFAULT_LOG_EVERY_N_STEPS if value is None else value,
        allow_zero=True,
    )
