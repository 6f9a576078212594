"""The Trainer's callback list: built from the constructor's arguments (`build_callbacks`),
and merged at the start of every call (fit / validate / test / predict) with what
``TrainModule.configure_callbacks`` returns (`with_module_callbacks`), as Lightning 2.6 does.

A returned callback replaces the Trainer's callbacks of its class or of a class it derives from
(a module's ``EarlyStopping`` replaces the one given to the Trainer); the others are added. Then
the list is put in Lightning's order: the finders (BatchSizeFinder, LearningRateFinder) first,
checkpoint callbacks last, so they see what every other callback did — and this package's
FitSummary after them (it reports where the checkpoints went).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.options import is_checkpoint_callback, is_instance_named, is_progress_bar

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule

__all__ = ["build_callbacks", "in_lightning_order", "with_module_callbacks"]

_FINDERS = ("BatchSizeFinder", "LearningRateFinder")


def in_lightning_order(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` with the finders first, then the rest, then checkpoint callbacks, then
    FitSummary; the order inside each group is kept."""
    finders = [c for c in callbacks if any(is_instance_named(c, name) for name in _FINDERS)]
    summaries = [c for c in callbacks if is_instance_named(c, "FitSummary")]
    checkpoints = [c for c in callbacks if is_checkpoint_callback(c) and c not in summaries]
    placed = {id(c) for c in (*finders, *summaries, *checkpoints)}
    others = [c for c in callbacks if id(c) not in placed]
    return finders + others + checkpoints + summaries


def with_module_callbacks(callbacks: list[Callback], module: TrainModule) -> list[Callback]:
    """The Trainer's ``callbacks`` merged with what ``module.configure_callbacks()`` returns.

    Raises:
        ConfigurationError: it returned something that is not a Callback (or a list of them).
    """
    returned = module.configure_callbacks()
    if not returned:
        return callbacks
    given = [returned] if isinstance(returned, Callback) else list(returned)
    for item in given:
        if not isinstance(item, Callback):
            raise ConfigurationError(
                f"{type(module).__name__}.configure_callbacks() returned {describe(item)}; "
                "expected a trainer.callbacks.Callback or a list of them."
            )
    given_types = {type(c) for c in given}
    replaced = {
        type(c)
        for c in callbacks
        if type(c) is not Callback and any(issubclass(t, type(c)) for t in given_types)
    }
    kept = [c for c in callbacks if type(c) not in replaced]
    return in_lightning_order(kept + given)


def build_callbacks(
    callbacks: Any,
    enable_progress_bar: bool,
    enable_model_summary: bool,
    enable_checkpointing: bool,
    checkpointing_given: bool = True,
    max_time: dt.timedelta | None = None,
) -> list[Callback]:
    """The Trainer's callbacks: the given ones, the defaults added, in Lightning's order.

    ``enable_checkpointing``: add a ModelCheckpoint when no checkpoint callback is given (False
    under ``fast_dev_run`` too); ``checkpointing_given``: the argument as the user gave it.
    ``max_time``: add ``Timer(duration=max_time, interval="step")`` unless a Timer is given
    (Lightning's: the Timer stops the fit, and its elapsed time is saved in checkpoints).

    Raises:
        ConfigurationError: an item is not a Callback, or a checkpoint callback is given with
            ``enable_checkpointing=False`` (Lightning refuses it too).
    """
    given = (
        []
        if callbacks is None
        else [callbacks]
        if isinstance(callbacks, Callback)
        else list(callbacks)
    )
    for item in given:
        if not isinstance(item, Callback):
            raise ConfigurationError(
                f"Trainer(callbacks=...): {describe(item)} is not a trainer.callbacks.Callback."
            )
    if enable_model_summary and not any(is_instance_named(cb, "ModelSummary") for cb in given):
        from trainer.callbacks.model_summary import ModelSummary

        given.insert(0, ModelSummary())
    if max_time is not None and not any(is_instance_named(cb, "Timer") for cb in given):
        from trainer.callbacks.timer import Timer

        given.append(Timer(duration=max_time, interval="step"))
    if enable_progress_bar and not any(is_progress_bar(cb) for cb in given):
        from trainer.callbacks.progress import RichProgressBar

        given.append(RichProgressBar())
    checkpoints = [type(cb).__name__ for cb in given if is_checkpoint_callback(cb)]
    if checkpoints and not checkpointing_given:
        raise ConfigurationError(
            f"Trainer(enable_checkpointing=False, callbacks=[..., {checkpoints[0]}, ...]): the "
            "callbacks write checkpoints. Remove them, or drop enable_checkpointing=False."
        )
    if enable_checkpointing and not checkpoints:  # Lightning: none when any Checkpoint is given
        from trainer.callbacks.model_checkpoint import ModelCheckpoint

        given.append(ModelCheckpoint())
    if enable_model_summary and not any(is_instance_named(cb, "FitSummary") for cb in given):
        from trainer.callbacks.fit_summary import FitSummary

        given.append(FitSummary())  # last: it reports where the final checkpoints went
    _check_state_keys(given)
    return in_lightning_order(given)  # checkpoint callbacks last: they see what others did


def _check_state_keys(callbacks: list[Callback]) -> None:
    """Two callbacks with state under one ``state_key`` would restore each other's state from a
    checkpoint: refused, as Lightning refuses it."""
    seen: dict[str, Callback] = {}
    for callback in callbacks:
        if not callback.state_dict():
            continue
        key = callback.state_key
        if key in seen:
            raise ConfigurationError(
                f"Trainer(callbacks=...): two {type(callback).__name__} callbacks have the same "
                f"state_key {key!r}, so a checkpoint could not tell their states apart (as in "
                "Lightning). Give them different settings (monitor, mode, every_n_* or "
                "train_time_interval), or keep one."
            )
        seen[key] = callback
