"""Lightning's ``Tuner``: run the learning-rate or batch-size search alone, before a fit.

``Tuner(trainer).lr_find(module)`` / ``.scale_batch_size(module)`` add the finder callback
(`LearningRateFinder`, `BatchSizeFinder`) to the Trainer, start ``trainer.fit``, and end that
fit cleanly as soon as the search is done at ``on_fit_start`` (``callback.TunerExit``): no epoch runs, the
callbacks after the finder and ``on_train_start`` are not called, the Trainer tears down as after
a finished fit and can fit again. The callback is removed afterwards. This module owns only that
wrapping; the searches are the callbacks'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.callbacks.batch_size_finder import BatchSizeFinder
from trainer.callbacks.callback import TunerExit
from trainer.callbacks.lr_finder import LearningRateFinder, lr_attribute
from trainer.errors import ConfigurationError

if TYPE_CHECKING:
    from trainer.callbacks.callback import Callback
    from trainer.trainer.module import DataModule, TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["Tuner"]


class _ExitAfterSearch:
    """Mixed in before a finder: its search at ``on_fit_start``, then the fit ends."""

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        super().on_fit_start(trainer, module)  # type: ignore[misc]  # the finder's search
        raise TunerExit


class _ExitingLearningRateFinder(_ExitAfterSearch, LearningRateFinder):
    pass


class _ExitingBatchSizeFinder(_ExitAfterSearch, BatchSizeFinder):
    pass


class Tuner:
    """Lightning's ``lightning.pytorch.tuner.Tuner`` for a `trainer.Trainer`.

    Example:
        >>> tuner = Tuner(trainer)
        >>> finder = tuner.lr_find(module, num_training=50)  # sets module.lr (update_attr)
        >>> finder.suggestion(), len(finder.results["lr"])
        >>> tuner.scale_batch_size(module, mode="binsearch")  # sets module.batch_size
        >>> trainer.fit(module)
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def lr_find(
        self,
        model: TrainModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> LearningRateFinder:
        """Run `LearningRateFinder`'s range test now; return the finder (``suggestion()``,
        ``results``, ``plot()``). ``attr_name=""`` picks ``lr`` or ``learning_rate``, as
        Lightning does.

        Raises:
            ConfigurationError: ``method`` is not "fit"; with ``update_attr``, no ``attr_name``
                given and the module has neither ``lr`` nor ``learning_rate``.
        """
        _check_method(method, "lr_find")
        finder = _ExitingLearningRateFinder(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=update_attr,
            attr_name=attr_name or lr_attribute(model, datamodule, required=update_attr),
        )
        self._run(finder, model, train_dataloaders, val_dataloaders, datamodule)
        return finder

    def scale_batch_size(
        self,
        model: TrainModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> int | None:
        """Run `BatchSizeFinder`'s search now; return the batch size found (also set on the
        module or DataModule under ``batch_arg_name``).

        Raises:
            ConfigurationError: ``method`` is not "fit", or as `BatchSizeFinder` raises.
        """
        _check_method(method, "scale_batch_size")
        finder = _ExitingBatchSizeFinder(
            mode=mode,
            steps_per_trial=steps_per_trial,
            init_val=init_val,
            max_trials=max_trials,
            batch_arg_name=batch_arg_name,
            margin=margin,
            max_val=max_val,
        )
        self._run(finder, model, train_dataloaders, val_dataloaders, datamodule)
        return finder.optimal_batch_size

    def _run(
        self,
        finder: Callback,
        model: TrainModule,
        train_dataloaders: Any,
        val_dataloaders: Any,
        datamodule: DataModule | None,
    ) -> None:
        trainer = self._trainer
        trainer.callbacks.insert(0, finder)  # finders run first at on_fit_start, as in Lightning
        try:
            trainer.fit(model, train_dataloaders, val_dataloaders, datamodule=datamodule)
        finally:
            trainer.callbacks.remove(finder)


def _check_method(method: str, name: str) -> None:
    if method != "fit":
        raise ConfigurationError(
            f"Tuner.{name}(method={method!r}): only 'fit' is supported here. Run the search "
            "before a fit; for evaluation, subclass the finder callback and call its search "
            "from on_validation_start (docs/callbacks_averaging_finders.md)."
        )
