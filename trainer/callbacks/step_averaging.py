"""WeightAveraging and EMAWeightAveraging: an average of the weights updated after optimizer
steps (or epochs), as Lightning 2.6's callbacks of these names.

This module owns when the average is updated (`WeightAveraging.should_update`, which a subclass
overrides), when it is swapped into the module (validation, end of fit) and how it travels in
checkpoints. The arithmetic is torch's ``torch.optim.swa_utils.AveragedModel``: an equal-weight
average by default (SWA), an exponential moving average with ``get_ema_avg_fn`` /
``get_ema_multi_avg_fn``. The average itself is a `ModuleAverage`
(``trainer/callbacks/module_average.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import get_ema_avg_fn, get_ema_multi_avg_fn

from trainer.callbacks.arguments import bad_argument, check_device, is_int, is_number
from trainer.callbacks.callback import Callback
from trainer.callbacks.module_average import ModuleAverage

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["EMAWeightAveraging", "WeightAveraging"]

_AVERAGED_MODEL_ARGS = ("avg_fn", "multi_avg_fn")


class WeightAveraging(Callback):
    """An average of the weights, updated after the optimizer steps (or epochs) that
    `should_update` picks, as Lightning's ``WeightAveraging``.

    With no averaging function the average is equal-weighted (SWA); ``avg_fn`` /
    ``multi_avg_fn`` (``torch.optim.swa_utils.AveragedModel``'s) change it, e.g.
    ``avg_fn=get_ema_avg_fn(0.99)``. By default it is updated after every optimizer step; override
    ``should_update(step_idx, epoch_idx)`` to choose. Validation during fit runs on the average
    (swapped in at ``on_validation_start``, back at ``on_validation_end``), and when training
    ends the module holds the average.

    Checkpoints: the model weights of a checkpoint are the average, ready for inference; the
    training weights are saved in this callback's state (``"current"``), with ``n_averaged`` and
    the step and epoch of the last update. Resuming with this callback puts the training weights
    back into the module and continues the same average.

    Args:
        device: where the average lives; None: the module's device.
        use_buffers: average the buffers too (e.g. BatchNorm statistics); False keeps them equal
            to the module's.
        kwargs: ``avg_fn`` or ``multi_avg_fn`` for ``AveragedModel``; and, beyond Lightning,
            ``decay`` (an EMA with this decay), ``update_every_n_steps`` (the default
            `should_update` updates after every n-th step) and ``eval_with_average`` (False:
            validate on the training weights).

    Raises:
        ConfigurationError: an argument is out of range or unknown (the message names it).

    Examples:
        >>> swa = WeightAveraging()  # the equal-weight average of the weights after each step
        >>> ema = WeightAveraging(avg_fn=torch.optim.swa_utils.get_ema_avg_fn(0.99))
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        decay = kwargs.pop("decay", None)
        every = kwargs.pop("update_every_n_steps", 1)
        self.eval_with_average = kwargs.pop("eval_with_average", True)
        unknown = sorted(set(kwargs) - set(_AVERAGED_MODEL_ARGS))
        if unknown:
            raise bad_argument(
                owner,
                unknown[0],
                kwargs[unknown[0]],
                "no such argument: WeightAveraging takes device, use_buffers, avg_fn, "
                "multi_avg_fn, decay, update_every_n_steps and eval_with_average",
            )
        for name in _AVERAGED_MODEL_ARGS:
            if kwargs.get(name) is not None and not callable(kwargs[name]):
                raise bad_argument(owner, name, kwargs[name], "a function, as AveragedModel takes")
        if decay is not None:
            if not is_number(decay) or not 0.0 <= decay <= 1.0:
                raise bad_argument(owner, "decay", decay, "a float in [0, 1], e.g. 0.999")
            if not any(kwargs.get(name) for name in _AVERAGED_MODEL_ARGS):
                kwargs["multi_avg_fn"] = get_ema_multi_avg_fn(float(decay))
        if not is_int(every) or every < 1:
            raise bad_argument(owner, "update_every_n_steps", every, "an int >= 1")
        self.decay = decay
        self.update_every_n_steps = every
        self.use_buffers = use_buffers
        self.device = check_device(owner, device)
        self._averaged_model_args = {k: v for k, v in kwargs.items() if v is not None}
        self._average: ModuleAverage | None = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._restored: dict[str, Any] | None = None  # from a checkpoint, applied at on_fit_start
        self._restored_average: dict[str, torch.Tensor] | None = None

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average now: called after each optimizer step with its
        zero-based index, and after each training epoch with its index. Default: after every
        ``update_every_n_steps``-th step (every step), never at an epoch's end."""
        return step_idx is not None and step_idx % self.update_every_n_steps == 0

    @property
    def n_averaged(self) -> int:
        """How many weight snapshots the average has folded in."""
        return 0 if self._average is None else self._average.n_averaged

    def averaged_tensors(self) -> dict[str, torch.Tensor]:
        """The averaged parameters (and buffers with ``use_buffers``) by the module's names."""
        return {} if self._average is None else self._average.tensors(averaged=True)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._average = ModuleAverage(
            module, device=self.device, use_buffers=self.use_buffers, **self._averaged_model_args
        )
        self._latest_update_step, self._latest_update_epoch = 0, -1
        restored, self._restored = self._restored, None
        average, self._restored_average = self._restored_average, None
        if restored:
            self._latest_update_step = restored.get("latest_update_step", 0)
            self._latest_update_epoch = restored.get("latest_update_epoch", -1)
            if average is not None:
                self._average.load_averaged(average, restored.get("n_averaged", 0))

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._average.update()  # type: ignore[union-attr]  # built at on_fit_start
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._average.update()  # type: ignore[union-attr]
            self._latest_update_epoch = epoch

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._hold_average(trainer, True)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._hold_average(trainer, False)

    def _hold_average(self, trainer: Trainer, should_hold: bool) -> None:
        average = self._average
        is_fit = trainer.state.stage == "fit"
        if self.eval_with_average and is_fit and average is not None:
            if average.is_swapped != should_hold:
                average.swap()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        if trainer.state.stage == "fit" and self._average is not None and self._average.is_swapped:
            self._average.swap()  # failed during validation: leave the training weights in place

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._average is not None and not self._average.is_swapped:
            self._average.swap()  # the module holds the average; the mirror keeps the weights

    def state_dict(self) -> dict[str, Any]:
        return {
            "n_averaged": self.n_averaged,
            "latest_update_step": self._latest_update_step,
            "latest_update_epoch": self._latest_update_epoch,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict)

    def on_save_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average is None:
            return
        weights = checkpoint["state_dict"]
        averaged = self._average.tensors(averaged=True)
        current = self._average.tensors(averaged=False)
        names = [name for name in averaged if name in weights]
        for name in names:
            weights[name] = averaged[name]
        state = (checkpoint.get("callbacks") or {}).get(self.state_key)
        if state is not None:  # a full checkpoint (weights-only ones carry just the average)
            state["current"] = {name: current[name] for name in names}

    def on_load_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None:
        state = (checkpoint.get("callbacks") or {}).get(self.state_key) or {}
        current = state.get("current")
        if trainer.state.stage != "fit" or not current:
            return  # validate/test/predict use the average the checkpoint's weights hold
        weights = checkpoint["state_dict"]
        self._restored_average = {name: weights[name] for name in current if name in weights}
        checkpoint["state_dict"] = {**weights, **current}  # resume from the training weights


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights, as Lightning's ``EMAWeightAveraging``:
    ``average = decay * average + (1 - decay) * weights`` (the first update copies them) after
    every ``update_every_n_steps``-th optimizer step from step ``update_starting_at_step`` on, and
    after every epoch from ``update_starting_at_epoch`` on when given.

    Examples:
        >>> ema = EMAWeightAveraging(decay=0.99, update_starting_at_step=100)
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not is_number(decay) or not 0.0 <= decay <= 1.0:
            raise bad_argument(
                "EMAWeightAveraging", "decay", decay, "a float in [0, 1], e.g. 0.999"
            )
        for name, value in (
            ("update_starting_at_step", update_starting_at_step),
            ("update_starting_at_epoch", update_starting_at_epoch),
        ):
            if value is not None and (not is_int(value) or value < 0):
                raise bad_argument("EMAWeightAveraging", name, value, "None or an int >= 0")
        super().__init__(
            device=device,
            use_buffers=use_buffers,
            update_every_n_steps=update_every_n_steps,
            avg_fn=get_ema_avg_fn(decay=decay),
            **kwargs,
        )
        self.decay = decay
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """After a step: from ``update_starting_at_step`` on, every ``update_every_n_steps``-th
        one; after an epoch: from ``update_starting_at_epoch`` on, when it is given."""
        if step_idx is not None:
            is_started = self.update_starting_at_step is None or (
                step_idx >= self.update_starting_at_step
            )
            if is_started and step_idx % self.update_every_n_steps == 0:
                return True
        return (
            epoch_idx is not None
            and self.update_starting_at_epoch is not None
            and epoch_idx >= self.update_starting_at_epoch
        )
