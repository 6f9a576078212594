"""Which implementations each hook runs, in Lightning 2.6's order, and calling them.

The Trainer builds one `HookTable` per ``fit`` / ``validate`` / ``test`` / ``predict`` from its
callbacks and the module. The order itself is data in `trainer.trainer.hooks`; this module only
applies it. Hooks nobody overrides get an empty list, so the loop skips them without a call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError
from trainer.profilers import Profiler
from trainer.trainer import profiling
from trainer.trainer.dataloader_idx import takes_dataloader_idx
from trainer.trainer.hooks import (
    CALLBACK_HOOKS,
    CALLBACK_ONLY_HOOKS,
    LOG_KEYS,
    LOGGING_REFUSED_HOOKS,
    MONITORING_CALLBACKS,
)
from trainer.trainer.log_refusal import refusing_logs
from trainer.trainer.metrics import MetricStore
from trainer.trainer.module_hooks import ModuleHooks
from trainer.trainer.options import is_instance_named

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["HookTable", "is_overridden"]


class HookTable:
    """For each hook name, the functions to call: callbacks in list order, then the module.

    ``on_load_checkpoint`` runs the module first; in ``on_train_epoch_end`` the monitoring
    callbacks (ModelCheckpoint, EarlyStopping) are kept apart in `epoch_end_monitors`, called by
    the loop once the module's epoch-end metrics are in. With a profiler each function is timed
    as ``[Callback]Class.hook`` / ``[TrainModule]Class.hook``.
    """

    def __init__(
        self,
        trainer: Trainer,
        module: TrainModule,
        callbacks: Iterable[Callback],
        profiler: Profiler | None = None,
    ) -> None:
        self._module = module
        self._functions: dict[str, list[Callable[..., Any]]] = {}
        self._module_functions: dict[str, Callable[..., Any]] = {}
        # Per evaluation batch hook, for each function: whether it takes dataloader_idx.
        self._takes_index: dict[str, list[bool]] = {}
        self._raw: dict[str, list[Callable[..., Any]]] = {}  # unprofiled, for signatures
        self.epoch_end_monitors: list[Callable[..., Any]] = []
        callbacks = list(callbacks)
        for name in CALLBACK_HOOKS:
            own: list[Callable[..., Any]] = []
            raw: dict[int, Callable[..., Any]] = {}
            if name not in CALLBACK_ONLY_HOOKS and is_overridden(module, name, ModuleHooks):
                own.append(_timed(profiler, getattr(module, name), module, name, "TrainModule"))
                self._module_functions[name] = own[0]
                raw[id(own[0])] = getattr(module, name)
            before: list[Callable[..., Any]] = []
            after: list[Callable[..., Any]] = []
            for callback in callbacks:
                if not is_overridden(callback, name, Callback):
                    continue
                bound = partial(getattr(callback, name), trainer, module)
                function = _timed(profiler, bound, callback, name)
                raw[id(function)] = bound
                is_monitor = name == "on_train_epoch_end" and any(
                    is_instance_named(callback, monitor) for monitor in MONITORING_CALLBACKS
                )
                (after if is_monitor else before).append(function)
            self._functions[name] = (
                [*own, *before] if name == "on_load_checkpoint" else [*before, *own]
            )
            if name in LOGGING_REFUSED_HOOKS:  # only these pay for the guard
                guarded = [refusing_logs(f, module, name) for f in self._functions[name]]
                raw = {
                    id(g): raw[id(f)] for f, g in zip(self._functions[name], guarded, strict=True)
                }
                if name in self._module_functions:
                    index = self._functions[name].index(self._module_functions[name])
                    self._module_functions[name] = guarded[index]
                self._functions[name] = guarded
            if name == "on_train_epoch_end":
                self.epoch_end_monitors = after
            self._raw[name] = [raw[id(function)] for function in self._functions[name]]

    def __getitem__(self, name: str) -> list[Callable[..., Any]]:
        """The functions hook ``name`` runs (empty when nobody overrides it)."""
        return self._functions[name]

    def call(self, name: str, *args: Any) -> Any:
        """Run hook ``name``; return the module's result (-1 from ``on_train_batch_start`` ends
        the epoch)."""
        functions = self._functions.get(name)
        if functions is None:
            raise ConfigurationError(
                f"internal: {name!r} is not a hook; see trainer.trainer.hooks.CALLBACK_HOOKS"
            )
        store, previous = self._log_as(name)
        try:
            module_function = self._module_functions.get(name)
            result = None
            for function in functions:
                returned = function(*args)
                if function is module_function:
                    result = returned
        finally:
            if previous is not None:
                store.hook = previous
        return result

    def call_with_dataloader_idx(self, name: str, *args: Any) -> None:
        """Run evaluation batch hook ``name`` with ``args`` ending in ``dataloader_idx``, which a
        callback's override written without that parameter does not receive."""
        takes = self._takes_index.get(name)
        if takes is None:
            takes = [takes_dataloader_idx(raw, len(args) - 1) for raw in self._raw[name]]
            self._takes_index[name] = takes
        store, previous = self._log_as(name)
        try:
            for function, takes_index in zip(self._functions[name], takes, strict=True):
                if takes_index:
                    function(*args)
                else:
                    function(*args[:-1])
        finally:
            if previous is not None:
                store.hook = previous

    def _log_as(self, name: str) -> tuple[Any, Any]:
        """Make ``self.log`` follow hook ``name``'s rules and keep its own values (`LOG_KEYS`);
        return the store and the key to put back after the hook (None: nothing changed)."""
        store = self._module.metric_store
        key = LOG_KEYS.get(name)
        if key is None or type(store) is not MetricStore:
            return store, None
        previous, store.hook = store.hook, key
        return store, previous


def is_overridden(obj: object, name: str, base: type) -> bool:
    """Whether ``obj`` implements hook ``name``: on its class, or assigned on the instance."""
    return name in vars(obj) or getattr(type(obj), name, None) is not getattr(base, name)


def _timed(
    profiler: Profiler | None,
    function: Callable[..., Any],
    owner: object,
    name: str,
    kind: str = "Callback",
) -> Callable[..., Any]:
    if not profiling.is_profiling(profiler):
        return function
    return profiling.profiled(profiler, f"[{kind}]{type(owner).__name__}.{name}", function)
