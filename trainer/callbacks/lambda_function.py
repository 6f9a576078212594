"""LambdaCallback: a callback made of plain functions, one per hook, passed by keyword.

This module owns checking the hook names and turning the functions into hook methods. The
Trainer calls only the hooks a callback's class overrides (an empty hook costs nothing), so each
LambdaCallback gets its own subclass holding exactly the given functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.hooks import CALLBACK_HOOKS

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """Build a callback from functions: ``LambdaCallback(on_train_epoch_end=fn, ...)``.

    Each keyword is a hook name from `trainer.trainer.hooks.CALLBACK_HOOKS`; its function receives
    what the hook receives, ``(trainer, module, *hook_arguments)``. A None value is ignored
    (so Lightning code passing ``setup=None`` ports as is).

    Args:
        **hooks: hook name -> function.

    Raises:
        ConfigurationError: a name is not a hook (the message lists the hooks), or a value is not
            callable.

    Examples:
        >>> losses = []
        >>> record = LambdaCallback(
        ...     on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: losses.append(
        ...         float(outputs["loss"])
        ...     )
        ... )
        >>> # after Trainer(callbacks=[record]).fit(module) on 8 batches: len(losses) == 8
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(name for name in hooks if name not in CALLBACK_HOOKS)
        if unknown:
            raise ConfigurationError(
                f"LambdaCallback({', '.join(f'{name}=...' for name in unknown)}): not a hook "
                f"name. Valid hooks: {', '.join(CALLBACK_HOOKS)}."
            )
        given = {name: function for name, function in hooks.items() if function is not None}
        for name, function in given.items():
            if not callable(function):
                raise ConfigurationError(
                    f"LambdaCallback({name}={describe(function)}): expected a function taking "
                    "(trainer, module, ...hook arguments)."
                )
        self.hooks = given
        # The Trainer looks for overridden hooks on the class: give this instance its own.
        methods: dict[str, Any] = {name: staticmethod(fn) for name, fn in given.items()}
        methods["__qualname__"] = "LambdaCallback"
        methods["__module__"] = __name__
        self.__class__ = type("LambdaCallback", (LambdaCallback,), methods)

    def __repr__(self) -> str:
        return f"LambdaCallback({', '.join(f'{name}=...' for name in self.hooks)})"
