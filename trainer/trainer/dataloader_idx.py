"""Who receives ``dataloader_idx`` when an evaluation stage has several dataloaders.

Lightning passes ``dataloader_idx`` to the module's ``validation_step`` / ``test_step`` /
``predict_step`` and to the ``on_*_batch_start`` / ``on_*_batch_end`` hooks only when a stage has
more than one dataloader, and refuses a module whose overridden step or batch hook cannot take it
then (or requires it with one dataloader). `check_dataloader_idx` applies that rule before the
epoch starts. ``Callback``'s own batch hooks declare ``dataloader_idx: int = 0`` as Lightning's
do; a callback that overrides one without the argument is called without it (where Lightning
would fail): `takes_dataloader_idx` tells them apart once, when the hook table is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainer.errors import ConfigurationError

__all__ = ["check_dataloader_idx", "takes_dataloader_idx"]

_STEPS = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}


def takes_dataloader_idx(function: Callable[..., Any], positional: int) -> bool:
    """Whether ``function`` accepts ``positional`` arguments plus ``dataloader_idx`` after them."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read: pass it, as Lightning does
        return True
    try:
        signature.bind(*range(positional + 1))
    except TypeError:
        return False
    return True


def check_dataloader_idx(module: Any, stage: str, *, is_multiple: bool) -> None:
    """Lightning's check of the module's step and batch hooks against the number of loaders.

    Raises:
        ConfigurationError: several dataloaders and a step / batch hook without a
            ``dataloader_idx`` parameter, or one dataloader and one that requires it.
    """
    names = (_STEPS[stage], f"on_{stage}_batch_start", f"on_{stage}_batch_end")
    owner = type(module).__name__
    for name in names:
        function = getattr(module, name, None)
        if function is None:
            continue
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            continue
        has_varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values())
        parameter = parameters.get("dataloader_idx")
        if is_multiple and parameter is None and not has_varargs:
            raise ConfigurationError(
                f"{owner}.{name} has no dataloader_idx parameter, but {stage} has several "
                f"dataloaders, so it is called with one (as in Lightning). Add "
                f"`dataloader_idx=0` to {owner}.{name}'s signature."
            )
        if not is_multiple and parameter is not None and parameter.default is parameter.empty:
            raise ConfigurationError(
                f"{owner}.{name} requires dataloader_idx, but {stage} has one dataloader, so it "
                f"is called without one (as in Lightning). Give it a default: `dataloader_idx=0`."
            )
