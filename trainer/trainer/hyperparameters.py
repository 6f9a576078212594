"""``save_hyperparameters`` and ``self.hparams``, shared by TrainModule and DataModule.

Lightning 2.6's rules: with no argument, the arguments of every ``__init__`` on the way from the
class to the one that called it (a subclass's ``__init__`` calling ``super().__init__(...)``
adds its own arguments, and its values win); with names, those arguments; with one dict,
``argparse.Namespace`` or other mapping, its contents (the ``__init__`` argument that holds it is
remembered, so ``load_from_checkpoint`` passes the hyperparameters back under that name). A
second call adds to what the first recorded; ``ignore`` also drops names recorded before.
``logger=False`` keeps them out of the loggers (not out of checkpoints).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import types
from collections.abc import Mapping
from typing import Any

import torch

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError, describe

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


def _frame_init_args(frame: types.FrameType) -> dict[str, Any]:
    """The arguments one ``__init__`` frame received (``**kwargs`` merged in, ``*args`` not)."""
    info = inspect.getargvalues(frame)
    values: dict[str, Any] = {name: info.locals[name] for name in info.args[1:]}  # not self
    if info.keywords:
        values.update(info.locals[info.keywords])
    return values


def _is_init_of(frame: types.FrameType, owner: object) -> bool:
    """Whether ``frame`` runs an ``__init__`` of ``owner``."""
    if frame.f_code.co_name != "__init__" or not frame.f_code.co_argcount:
        return False
    return frame.f_locals.get(frame.f_code.co_varnames[0]) is owner


def _collect_init_args(frame: types.FrameType, owner: object) -> dict[str, Any]:
    """The arguments of the first ``__init__`` of ``owner`` from ``frame`` outwards (a helper
    that calls ``save_hyperparameters`` is skipped, as in Lightning) and of every ``__init__`` of
    ``owner`` that called it (``super().__init__`` chains); outer (subclass) values win."""
    current: types.FrameType | None = frame
    while current is not None and not _is_init_of(current, owner):
        current = current.f_back
    levels: list[dict[str, Any]] = []
    while current is not None and _is_init_of(current, owner):
        levels.append(_frame_init_args(current))
        current = current.f_back
    collected: dict[str, Any] = {}
    for level in levels:  # from the innermost __init__ to the subclass's
        collected.update(level)
    return collected


def _as_mapping(value: Any, owner: str) -> AttributeDict:
    """One object passed to ``save_hyperparameters``, as the hyperparameters it holds."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return AttributeDict(value)
    raise ConfigurationError(
        f"{owner}.save_hyperparameters({describe(value)}): pass argument names (str), or one "
        "dict, mapping or argparse.Namespace of hyperparameters."
    )


def _holder_name(init_args: dict[str, Any], value: Any) -> str | None:
    """The ``__init__`` argument that holds ``value`` (Lightning's ``hparams_name``)."""
    for name, candidate in init_args.items():
        if candidate is value:
            return name
    return None


class HyperparameterMixin:
    def save_hyperparameters(
        self,
        *names: Any,
        ignore: str | list[str] | None = None,
        frame: types.FrameType | None = None,
        logger: bool = True,
    ) -> None:
        """Record ``__init__`` arguments as ``self.hparams`` (Lightning's rules, above).

        They go to checkpoints and, unless ``logger=False``, to every logger.

        Args:
            names: argument names to keep (default: all of them), or one dict / mapping /
                ``argparse.Namespace`` whose contents are the hyperparameters.
            ignore: argument names to leave out (also removed if recorded before).
            frame: the ``__init__`` frame to read instead of the caller's.
            logger: whether the Trainer sends them to the loggers.

        Raises:
            ConfigurationError: a name is not an argument of ``__init__``, or an object that is
                not a mapping or Namespace was passed.

        Examples:
            >>> class Net(TrainModule):
            ...     def __init__(self, lr: float = 0.1, hidden: int = 32):
            ...         super().__init__()
            ...         self.save_hyperparameters()
            >>> Net(lr=0.01).hparams.lr
            0.01
        """
        owner = type(self).__name__
        if len(names) == 1 and not isinstance(names[0], str) and not names[0]:
            return  # an empty container: nothing to record (Lightning)
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        if frame is None:
            return
        init_args = _collect_init_args(frame, self)
        ignored = (
            {ignore} if isinstance(ignore, str) else {i for i in ignore or () if isinstance(i, str)}
        )
        init_args = {k: v for k, v in init_args.items() if k not in ignored}
        objects = [value for value in names if not isinstance(value, str)]
        if len(objects) == 1:
            recorded = _as_mapping(objects[0], owner)
            holder = _holder_name(init_args, objects[0])
        elif names:
            wanted = [n for n in names if isinstance(n, str)]
            missing = [n for n in wanted if n not in init_args]
            if missing:
                raise ConfigurationError(
                    f"{owner}.save_hyperparameters{tuple(names)}: {missing} are not arguments "
                    f"of {owner}.__init__ (its arguments: {sorted(init_args)})."
                )
            recorded, holder = AttributeDict({n: init_args[n] for n in wanted}), "kwargs"
        else:
            recorded, holder = AttributeDict(init_args), "kwargs" if init_args else None
        hparams = self.hparams
        hparams.update(recorded)
        for name in ignored:
            hparams.pop(name, None)
        for name, value in hparams.items():
            if isinstance(value, torch.nn.Module):
                warn_user(
                    f"{owner}.save_hyperparameters: {name!r} is a torch.nn.Module, whose weights "
                    f"the checkpoint holds already; use save_hyperparameters(ignore=[{name!r}])."
                )
        object.__setattr__(self, "_hparams_name", holder)
        object.__setattr__(self, "_log_hyperparams", logger)
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
