"""``save_hyperparameters`` and ``self.hparams``, shared by TrainModule and DataModule."""

from __future__ import annotations

import copy
import inspect
from typing import Any

from trainer.errors import ConfigurationError

__all__ = ["AttributeDict", "HyperparameterMixin"]


class AttributeDict(dict):
    """A dict whose keys read as attributes: ``hparams.lr``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"no hyperparameter {key!r}; saved: {sorted(self)}") from err

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def _collect_init_args(
    frame: Any, names: tuple[str, ...], ignore: tuple[str, ...], owner: str
) -> AttributeDict:
    """The arguments of the ``__init__`` that called ``save_hyperparameters``."""
    info = inspect.getargvalues(frame)
    values: dict[str, Any] = {name: info.locals[name] for name in info.args if name != "self"}
    if info.varargs:
        values[info.varargs] = info.locals[info.varargs]
    if info.keywords:
        values.update(info.locals[info.keywords])
    if names:
        missing = [n for n in names if n not in values]
        if missing:
            raise ConfigurationError(
                f"{owner}.save_hyperparameters{names}: {missing} are not arguments of "
                f"{owner}.__init__ (its arguments: {sorted(values)})."
            )
        values = {n: values[n] for n in names}
    return AttributeDict({k: v for k, v in values.items() if k not in ignore})


class HyperparameterMixin:
    def save_hyperparameters(self, *names: str, ignore: str | list[str] | None = None) -> None:
        """Record ``__init__`` arguments (all of them, or those named) as ``self.hparams``.

        They are written to every logger and to checkpoints.

        Examples:
            >>> class Net(TrainModule):
            ...     def __init__(self, lr: float = 0.1, hidden: int = 32):
            ...         super().__init__()
            ...         self.save_hyperparameters()
            >>> Net(lr=0.01).hparams.lr
            0.01
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is None:
            return
        ignored = (ignore,) if isinstance(ignore, str) else tuple(ignore or ())
        hparams = _collect_init_args(caller, names, ignored, type(self).__name__)
        object.__setattr__(self, "_hparams", hparams)
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(hparams))

    @property
    def hparams(self) -> AttributeDict:
        """The saved hyperparameters (empty until ``save_hyperparameters`` is called)."""
        if "_hparams" not in self.__dict__:
            object.__setattr__(self, "_hparams", AttributeDict())
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as ``save_hyperparameters`` recorded them (later
        changes to ``self.hparams`` are not in it); empty before it is called."""
        return copy.deepcopy(self.__dict__.get("_hparams_initial", AttributeDict()))
