"""Hooks in which ``self.log`` raises, as in Lightning: the module's metric store stands aside.

While such a hook runs (``setup``, ``on_fit_start``, the batch-transfer hooks, ``lr_scheduler_step``,
the model mode hooks, ``configure_optimizers``, ``predict_step``, ...), the module's
``metric_store`` is a `RefusedLogging` whose ``log`` raises a `ConfigurationError` naming the hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from trainer.errors import ConfigurationError

__all__ = ["RefusedLogging", "logging_allowed", "refusing_logs"]


class RefusedLogging:
    """The module's metric store while a hook runs in which Lightning refuses ``self.log``;
    ``store`` is the one it stands in for."""

    def __init__(self, hook: str, store: Any) -> None:
        self.hook = hook
        self.store = store

    def log(self, name: str, value: Any, **options: Any) -> None:
        raise ConfigurationError(
            f"self.log({name!r}) in {self.hook}: logging is not possible in this hook, as in "
            "Lightning (no step or epoch of logged metrics is open). Log in a *_step, "
            "*_batch_end or *_epoch_end hook, or write to the logger itself: "
            "self.logger.log_metrics({...})."
        )


def refusing_logs(function: Callable[..., Any], module: Any, hook: str) -> Callable[..., Any]:
    """``function`` with the module's ``self.log`` refused while it runs (``hook`` named)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        store = module.metric_store
        module.metric_store = RefusedLogging(hook, store)
        try:
            return function(*args, **kwargs)
        finally:
            module.metric_store = store

    return call


@contextlib.contextmanager
def logging_allowed(module: Any) -> Iterator[None]:
    """Inside a hook that refuses ``self.log`` (a finder's ``on_fit_start``), let the training
    steps run there log as fit's own steps do."""
    store = module.metric_store
    if isinstance(store, RefusedLogging):
        module.metric_store = store.store
    try:
        yield
    finally:
        module.metric_store = store
