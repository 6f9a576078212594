"""``TrainModule.configure_callbacks``: callbacks a module brings with it, merged into the
Trainer's at the start of every call (fit / validate / test / predict) as Lightning 2.6 does.

A returned callback replaces the Trainer's callbacks of its class or of a class it derives from
(a module's ``EarlyStopping`` replaces the one given to the Trainer); the others are added. Then
the list is put in Lightning's order: the finders (BatchSizeFinder, LearningRateFinder) first,
checkpoint callbacks last, so they see what every other callback did — and this package's
FitSummary after them (it reports where the checkpoints went).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe
from trainer.trainer.options import is_checkpoint_callback, is_instance_named

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule

__all__ = ["in_lightning_order", "with_module_callbacks"]

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
