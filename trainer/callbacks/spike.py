"""SpikeDetection: notice a training loss far above its recent mean, then raise or undo the step.

This module owns the spike rules (running mean of the last ``window`` good losses, tolerances,
non-finite values; and Lightning's rule for its modes "min" / "max"), `LossSpikeError`, the file
of batches to exclude (Lightning's ``skip_batches.json``), and in ``mode="skip"`` the copy of
the last good weights and optimizer state that a spiked step is rolled back to. It reads the
loss from ``training_step``'s output in ``on_train_batch_end``; it never changes the loss or
gradients.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.callback import Callback
from trainer.checkpoint.atomic import atomic_write_text
from trainer.errors import AnomalyError, ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["LossSpikeError", "SpikeDetection"]

_MODES = ("raise", "skip", "warn", "min", "max")
_LIGHTNING_MODES = ("min", "max")  # Lightning's: the direction that is better; a spike raises


class LossSpikeError(AnomalyError):
    """`SpikeDetection` (``mode="raise"``) saw the training loss spike; names the step."""


class SpikeDetection(Callback):
    """Watch the training loss of every batch and act on a spike.

    A loss is a spike when, after ``warmup`` good batches, it exceeds the mean ``m`` of the last
    ``window`` good losses by at least ``rtol × |m|`` (when ``rtol`` is set) and at least
    ``atol`` (when ``atol`` is set) — with the defaults, a loss above 3 × the mean. With
    ``finite_only`` a NaN or infinite loss is always a spike. Spikes never enter the mean.

    What happens then (``mode``):

    - ``"raise"``: raise `LossSpikeError` naming the step, the loss and the mean; fit
      ends through ``on_exception`` as for any error.
    - ``"skip"``: undo the optimizer step the spiking batch took part in: the weights, buffers
      and optimizer state (momentum, Adam moments and step counts) go back to a copy taken after
      the last good step, and training goes on. With gradient accumulation the whole window is
      undone. ``global_step`` and the learning-rate schedule still count the step. Memory: one
      copy of the module's state and of the optimizer state (≈ 3× the parameters for Adam),
      refreshed after every step (a device-to-device copy of that size per step); meant for
      single-device and DDP runs, not sharded ones.
    - ``"warn"``: warn and go on.
    - ``"min"`` / ``"max"``: Lightning's ``SpikeDetection`` (a loss to minimize / maximize), its
      rule and action: from batch ``warmup`` of each epoch on, a loss that is not better than the
      previous good one and is ``atol`` and ``rtol × |m|`` away from the mean ``m`` (either
      side) is a spike; the batch and the one before it are added to ``exclude_batches_path``
      (default ``<default_root_dir>/skip_batches.json``) and `LossSpikeError` is raised.

    With ``exclude_batches_path`` set, every spike's batch and the one before it are written
    to that JSON file (rank zero; a folder gets ``skip_batches.json``), as Lightning writes them.
    Reading the loss syncs the device once per batch. Every process acts when any one spiked,
    so replicas stay identical. Spikes are listed in ``self.spikes``.

    Args:
        mode: ``"raise"``, ``"skip"``, ``"warn"``, or Lightning's ``"min"`` / ``"max"``.
        window: how many recent good losses the mean covers.
        warmup: good batches to see before checking (Lightning's modes: the batch index in the
            epoch from which on it checks); None: 5, or 1 in Lightning's modes (its default).
        atol: absolute margin above the mean, or None.
        rtol: margin above the mean relative to it, or None.
        exclude_batches_path: the JSON file (or folder) the spiking batches are written to.
        finite_only: treat NaN/inf losses as spikes (False: ignore them, for runs where the
            16-mixed GradScaler already skips such steps).

    Raises:
        ConfigurationError: an argument is invalid, e.g. both tolerances None.
        LossSpikeError: in ``mode="raise"``, during fit, at a spike.

    Examples:
        >>> detector = SpikeDetection(mode="skip", window=10, warmup=5, rtol=2.0)
        >>> # losses 1.0, 0.9, 0.8, 0.8, 0.7, then 5.0: the mean is 0.84 and 5.0 > 0.84 * 3,
        >>> # so that step is undone and detector.spikes[0]["loss"] == 5.0.
    """

    def __init__(
        self,
        mode: str = "raise",
        window: int = 10,
        warmup: int | None = None,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike[str] | None = None,
        finite_only: bool = True,
    ) -> None:
        if warmup is None:
            warmup = 1 if mode in _LIGHTNING_MODES else 5
        _check_arguments(mode, window, warmup, atol, rtol)
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.spikes: list[dict[str, Any]] = []
        self.bad_batches: list[int] = []  # each spike's batch and the one before (Lightning's)
        self._last_value = 0.0  # the last good loss (Lightning's modes compare with it)
        self._losses: deque[float] = deque(maxlen=window)
        self._num_good = 0
        self._is_window_bad = False  # a spike in the current accumulation window
        self._module_copy: dict[str, torch.Tensor] = {}
        self._optimizer_copies: list[dict[Any, dict[str, Any]]] = []

    # ---- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "losses": list(self._losses),
            "num_good": self._num_good,
            "spikes": self.spikes,
            "bad_batches": self.bad_batches,
            "last_value": self._last_value,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._losses = deque((float(x) for x in state_dict["losses"]), maxlen=self.window)
        self._num_good = int(state_dict["num_good"])
        self.spikes = list(state_dict.get("spikes", []))
        self.bad_batches = [int(x) for x in state_dict.get("bad_batches", [])]
        self._last_value = float(
            state_dict.get("last_value", self._losses[-1] if self._losses else 0.0)
        )

    # ---- hooks ----------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._is_window_bad = False
        if self.mode == "skip":
            self._module_copy, self._optimizer_copies = {}, []
            self._take_copy(trainer, module)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._module_copy, self._optimizer_copies = {}, []  # free the memory

    @torch.no_grad()
    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._observe(trainer, float(loss.detach().float().mean()), batch_idx)
        if self.mode == "skip" and trainer.accelerator.sync_gradients:
            if self._is_window_bad:
                self._restore_copy(trainer, module)
            else:
                self._take_copy(trainer, module)
            self._is_window_bad = False

    def _observe(self, trainer: Trainer, value: float, batch_idx: int) -> None:
        mean = sum(self._losses) / len(self._losses) if self._losses else math.nan
        if self.mode in _LIGHTNING_MODES:
            is_local = batch_idx >= self.warmup and self._is_lightning_spike(value, mean)
        else:
            is_warm = self._num_good >= max(self.warmup, 1)
            is_local = self.is_spike(value, mean) if is_warm or not math.isfinite(value) else False
        # any process's spike is every process's
        is_spike = trainer.strategy.reduce_boolean_decision(is_local, all=False)
        if not is_spike:
            if math.isfinite(value):
                self._losses.append(value)
                self._num_good += 1
                self._last_value = value
            return
        record = {
            "epoch": trainer.current_epoch,
            "batch_idx": batch_idx,
            "step": trainer.global_step,
            "loss": value,
            "mean": mean,
            "is_local": is_local,  # False: another process spiked (loss and mean are ours)
        }
        self.spikes.append(record)
        message = self._describe(record)
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        self._write_bad_batches(trainer)
        if self.mode in ("raise", *_LIGHTNING_MODES):
            raise LossSpikeError(message)
        if self.mode == "warn":
            warnings.warn(message, stacklevel=2)
        else:
            self._is_window_bad = True

    def is_spike(self, loss: float, mean: float) -> bool:
        """Whether ``loss`` is a spike against the running ``mean`` (the warmup aside).

        Examples:
            >>> detector = SpikeDetection(rtol=2.0)
            >>> detector.is_spike(2.5, 1.0), detector.is_spike(3.5, 1.0)
            (False, True)
        """
        if not math.isfinite(loss):
            return self.finite_only
        if math.isnan(mean):
            return False
        excess = loss - mean
        if excess <= 0:
            return False
        if self.atol is not None and excess < abs(self.atol):
            return False
        return self.rtol is None or excess >= abs(self.rtol * mean)

    def _is_lightning_spike(self, loss: float, mean: float) -> bool:
        """Lightning's rule: not better than the last good loss, and ``atol`` and ``rtol`` away
        from the running mean on either side; a non-finite loss with ``finite_only``."""
        if not math.isfinite(loss):
            return self.finite_only
        change = loss - self._last_value
        if (change <= 0) if self.mode == "min" else (change >= 0):
            return False
        distance = abs(loss - mean)  # nan before any good loss: no spike
        is_atol = self.atol is None or distance >= abs(self.atol)
        return is_atol and (self.rtol is None or distance >= abs(self.rtol * mean))

    def _write_bad_batches(self, trainer: Trainer) -> None:
        """Write ``bad_batches`` to the JSON file on rank zero (atomically), when there is one."""
        path = self.exclude_batches_path
        if path is None and self.mode in _LIGHTNING_MODES:
            path = os.path.join(trainer.default_root_dir, "skip_batches.json")
        if path is None or not trainer.is_global_zero:
            return
        path = os.fspath(path)
        if not path.endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        atomic_write_text(path, json.dumps(self.bad_batches, indent=4))

    def _describe(self, record: dict[str, Any]) -> str:
        where = f"step {record['step']} (epoch {record['epoch']}, batch {record['batch_idx']})"
        if not record["is_local"]:
            what = (
                f"another process's training loss spiked at {where} (this process: "
                f"{record['loss']:.6g}, mean {record['mean']:.6g})"
            )
        elif not math.isfinite(record["loss"]):
            what = f"the training loss is {record['loss']} at {where}"
        else:
            what = (
                f"the training loss spiked at {where}: {record['loss']:.6g} against a mean of "
                f"{record['mean']:.6g} over the last {len(self._losses)} batches "
                f"(rtol={self.rtol}, atol={self.atol})"
            )
        action = {
            "raise": "Lower the learning rate, clip gradients (Trainer(gradient_clip_val=1.0)), "
            "or pass SpikeDetection(mode='skip') to undo such steps.",
            "skip": "The step was undone.",
            "warn": "Training goes on.",
        }.get(self.mode, "Resume without the batches listed in the exclude_batches_path file.")
        return f"SpikeDetection: {what}. {action}"

    # ---- the copy of the last good state (mode="skip") ----------------------------------
    def _take_copy(self, trainer: Trainer, module: TrainModule) -> None:
        for name, tensor in module.state_dict().items():
            _copy_into(self._module_copy, name, tensor)
        optimizers = [getattr(opt, "optimizer", opt) for opt in trainer.optimizers]
        if len(self._optimizer_copies) != len(optimizers):
            self._optimizer_copies = [{} for _ in optimizers]
        for optimizer, copy in zip(optimizers, self._optimizer_copies, strict=True):
            for param in [p for p in copy if p not in optimizer.state]:
                del copy[param]
            for param, state in optimizer.state.items():
                saved = copy.setdefault(param, {})
                for key, value in state.items():
                    _copy_into(saved, key, value)

    def _restore_copy(self, trainer: Trainer, module: TrainModule) -> None:
        for name, tensor in module.state_dict().items():
            tensor.copy_(self._module_copy[name])
        optimizers = [getattr(opt, "optimizer", opt) for opt in trainer.optimizers]
        for optimizer, copy in zip(optimizers, self._optimizer_copies, strict=True):
            for param in [p for p in optimizer.state if p not in copy]:
                del optimizer.state[param]  # its first step was the one undone
            for param, saved in copy.items():
                optimizer.state[param] = {
                    key: value.clone() if isinstance(value, torch.Tensor) else value
                    for key, value in saved.items()
                }


def _copy_into(store: dict[Any, Any], key: Any, value: Any) -> None:
    """``store[key] = copy of value``, reusing the stored tensor's memory when it fits."""
    held = store.get(key)
    if not isinstance(value, torch.Tensor):
        store[key] = value
    elif isinstance(held, torch.Tensor) and held.shape == value.shape and held.dtype == value.dtype:
        held.copy_(value)
    else:
        store[key] = value.detach().clone()


def _check_arguments(
    mode: object, window: object, warmup: object, atol: object, rtol: object
) -> None:
    if mode not in _MODES:
        raise ConfigurationError(
            f"SpikeDetection(mode={describe(mode)}): expected 'raise', 'skip' (undo the step), "
            "'warn', or Lightning's 'min' / 'max' (the better direction; raise at a spike)."
        )
    for name, value, low in (("window", window, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigurationError(
                f"SpikeDetection({name}={describe(value)}): expected an int >= {low}."
            )
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value < 0
        ):
            raise ConfigurationError(
                f"SpikeDetection({name}={describe(value)}): expected a number >= 0 or None."
            )
    if atol is None and rtol is None:
        raise ConfigurationError(
            "SpikeDetection(atol=None, rtol=None): every loss above the mean would be a spike. "
            "Set rtol (e.g. 2.0: a loss above 3x the mean) or atol."
        )
