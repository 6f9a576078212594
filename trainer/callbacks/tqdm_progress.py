"""TQDMProgressBar: Lightning's default progress bar, drawn with `tqdm`.

This module owns the tqdm bars Lightning 2.6 shows (their descriptions, totals, positions and
when they refresh: every ``refresh_rate`` batches and at a stage's last batch) and the number
padding of Lightning's ``Tqdm`` class. What a bar may read and the metrics it shows are the base
class's (``progress_bar.py``). `tqdm` is imported when a bar is first built, not at import.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from trainer._imports import require
from trainer.callbacks.progress_bar import ProgressBar
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["TQDMProgressBar"]  # and `Tqdm`, built on first access (module __getattr__)

_PAD_SIZE = 5
_TQDM_CLASS: list[type] = []  # Lightning's Tqdm class, built on first use (it subclasses tqdm's)


def __getattr__(name: str) -> Any:
    if name == "Tqdm":  # `from trainer.callbacks.tqdm_progress import Tqdm` imports tqdm only then
        return _tqdm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tqdm_class() -> type:
    """``Tqdm``: a ``tqdm`` bar whose floats are padded to 5 characters, so it does not flicker."""
    if _TQDM_CLASS:
        return _TQDM_CLASS[0]
    module = "tqdm.auto" if importlib.util.find_spec("ipywidgets") else "tqdm"
    base = require(module, extra="all", feature="TQDMProgressBar").tqdm

    class Tqdm(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def format_num(n: int | float | str) -> str:
            should_be_padded = isinstance(n, float | str)
            if not isinstance(n, str):
                n = base.format_num(n)
            if should_be_padded and "e" not in n:
                if "." not in n and len(n) < _PAD_SIZE:
                    try:
                        float(n)
                    except ValueError:
                        return n
                    n += "."
                n += "0" * (_PAD_SIZE - len(n))
            return n

    _TQDM_CLASS.append(Tqdm)
    return Tqdm


class TQDMProgressBar(ProgressBar):
    """Show progress with `tqdm` bars, as Lightning's default bar does.

    Up to four bars: the sanity check, training (``Epoch N``, paused while validation runs),
    validation (``Validation DataLoader 0``, below the training bar, gone when it ends) and
    test or predict. The training bar shows ``v_num`` (the logger's version) and the
    ``prog_bar=True`` metrics. Only global rank zero draws.

    Args:
        refresh_rate: redraw every this many batches (and at each stage's last batch); 0 shows
            nothing. On Colab 1 becomes 20; the ``TQDM_MINITERS`` environment variable raises it.
        process_position: offset the bars by this many lines (two per position), to show
            them beside bars of your own.
        leave: keep each finished epoch's bar on screen.

    Raises:
        ConfigurationError: ``refresh_rate`` or ``process_position`` is not an int >= 0.
        MissingDependencyError: at the first bar, when `tqdm` is not installed.

    Examples:
        >>> Trainer(callbacks=[TQDMProgressBar(refresh_rate=10)])
        >>> # Epoch 0:  40%|████      | 40/100 [00:01<00:01, 38.12it/s, v_num=0, loss=0.412]
    """

    BAR_FORMAT = (
        "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
    )

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__()
        for name, value in (("refresh_rate", refresh_rate), ("process_position", process_position)):
            if type(value) is not int or value < 0:
                raise ConfigurationError(
                    f"TQDMProgressBar({name}=...): expected an int >= 0, received "
                    f"{describe(value)}. Pass e.g. {name}=1."
                )
        self._refresh_rate = _resolve_refresh_rate(refresh_rate)
        self._process_position = process_position
        self._enabled = True
        self._train_progress_bar: Any = None
        self._val_progress_bar: Any = None
        self._test_progress_bar: Any = None
        self._predict_progress_bar: Any = None
        self._leave = leave

    def __getstate__(self) -> dict[str, Any]:
        return {k: None if k.endswith("_progress_bar") else v for k, v in vars(self).items()}

    @property
    def train_progress_bar(self) -> Any:
        return self._bar("train")

    @train_progress_bar.setter
    def train_progress_bar(self, bar: Any) -> None:
        self._train_progress_bar = bar

    @property
    def val_progress_bar(self) -> Any:
        return self._bar("val")

    @val_progress_bar.setter
    def val_progress_bar(self, bar: Any) -> None:
        self._val_progress_bar = bar

    @property
    def test_progress_bar(self) -> Any:
        return self._bar("test")

    @test_progress_bar.setter
    def test_progress_bar(self, bar: Any) -> None:
        self._test_progress_bar = bar

    @property
    def predict_progress_bar(self) -> Any:
        return self._bar("predict")

    @predict_progress_bar.setter
    def predict_progress_bar(self, bar: Any) -> None:
        self._predict_progress_bar = bar

    def _bar(self, kind: str) -> Any:
        bar = getattr(self, f"_{kind}_progress_bar")
        if bar is None:
            raise TypeError(
                f"The `{type(self).__name__}._{kind}_progress_bar` reference has not been set yet."
            )
        return bar

    @property
    def refresh_rate(self) -> int:
        return self._refresh_rate

    @property
    def process_position(self) -> int:
        return self._process_position

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    # ---- the bars (override to customise) ---------------------------------------------------
    def _new_bar(self, desc: str, *, offset: int = 0, leave: bool = True, **kwargs: Any) -> Any:
        return _tqdm_class()(
            desc=desc,
            position=2 * self.process_position + offset,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stdout,
            bar_format=self.BAR_FORMAT,
            **kwargs,
        )

    def init_sanity_tqdm(self) -> Any:
        """The bar of the validation sanity check."""
        return self._new_bar(self.sanity_check_description, leave=False)

    def init_train_tqdm(self) -> Any:
        """The training bar."""
        return self._new_bar(self.train_description, smoothing=0)

    def init_predict_tqdm(self) -> Any:
        """The predict bar."""
        return self._new_bar(self.predict_description, smoothing=0)

    def init_validation_tqdm(self) -> Any:
        """The validation bar: below the training bar inside fit, and then not left behind."""
        has_main_bar = self.trainer.state.stage != "validate"
        return self._new_bar(
            self.validation_description, offset=int(has_main_bar), leave=not has_main_bar
        )

    def init_test_tqdm(self) -> Any:
        """The test bar."""
        return self._new_bar("Testing")

    # ---- hooks --------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.val_progress_bar = self.init_sanity_tqdm()
        self.train_progress_bar = _tqdm_class()(disable=True)  # a placeholder, as Lightning's

    def on_sanity_check_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.val_progress_bar.close()
        self.train_progress_bar.close()

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        _reset(self.train_progress_bar, self.total_train_batches, f"Epoch {trainer.current_epoch}")

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar, n = self._train_progress_bar, batch_idx + 1
        if bar is not None and self._should_update(n, bar.total):
            _update_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, module))

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, module))
        if self._leave:
            self.train_progress_bar.close()

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.train_progress_bar.close()

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.sanity_checking:
            self.val_progress_bar = self.init_validation_tqdm()

    def on_validation_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            desc = (
                self.sanity_check_description
                if trainer.sanity_checking
                else self.validation_description
            )
            total = self.total_val_batches_current_dataloader
            _reset(self.val_progress_bar, total, f"{desc} DataLoader {dataloader_idx}")

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance(self._val_progress_bar, batch_idx + 1)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if self._train_progress_bar is not None and trainer.state.stage == "fit":
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, module))

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.test_progress_bar = self.init_test_tqdm()

    def on_test_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            total = self.total_test_batches_current_dataloader
            desc = f"{self.test_description} DataLoader {dataloader_idx}"
            _reset(self.test_progress_bar, total, desc)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance(self._test_progress_bar, batch_idx + 1)

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.test_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.predict_progress_bar = self.init_predict_tqdm()

    def on_predict_batch_start(
        self,
        trainer: Trainer,
        module: TrainModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            total = self.total_predict_batches_current_dataloader
            desc = f"{self.predict_description} DataLoader {dataloader_idx}"
            _reset(self.predict_progress_bar, total, desc)

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance(self._predict_progress_bar, batch_idx + 1)

    def on_predict_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.predict_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Write a line above the active bar without breaking it."""
        for bar in (
            self._train_progress_bar,
            self._val_progress_bar,
            self._test_progress_bar,
            self._predict_progress_bar,
        ):
            if bar is not None and not bar.disable:
                bar.write(sep.join(map(str, args)), **kwargs)
                return

    def _advance(self, bar: Any, n: int) -> None:
        if bar is not None and self._should_update(n, bar.total):
            _update_n(bar, n)

    def _should_update(self, current: int, total: int | float | None) -> bool:
        return self.is_enabled and (current % self.refresh_rate == 0 or current == total)


def _resolve_refresh_rate(refresh_rate: int) -> int:
    """Lightning's: 20 on Colab instead of 1; at least ``TQDM_MINITERS`` when it is set."""
    if os.getenv("COLAB_GPU") and refresh_rate == 1:
        return 20
    if "TQDM_MINITERS" in os.environ:
        return max(int(os.environ["TQDM_MINITERS"]), refresh_rate)
    return refresh_rate


def _convert_inf(value: int | float | None) -> int | float | None:
    """tqdm shows no total for inf or nan."""
    if value is None or math.isinf(value) or math.isnan(value):
        return None
    return value


def _reset(bar: Any, total: int | float | None, description: str) -> None:
    bar.reset()
    bar.total = _convert_inf(total)
    bar.initial = 0
    bar.set_description(description)


def _update_n(bar: Any, value: int) -> None:
    if not bar.disable:
        bar.n = value
        bar.refresh()
