"""StochasticWeightAveraging: an average of the weights of the last epochs, with the SWA learning
rate (WeightAveraging and EMAWeightAveraging, averaged after steps, are in ``step_averaging.py``).

This module owns when the average is updated, where it lives, when it is swapped into the module
(validation, end of fit) and how it travels in checkpoints. The arithmetic is torch's own:
``torch.optim.swa_utils.AveragedModel`` (with ``get_ema_multi_avg_fn`` for the EMA), ``SWALR``
and ``update_bn``. It does not own the loop: the Trainer steps the SWALR scheduler like any
"epoch" scheduler, and the callbacks only read public attributes and answer hooks.

The average itself (the ``AveragedModel`` and swapping it in and out) is a `ModuleAverage`
(``trainer/callbacks/module_average.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import SWALR, update_bn

from trainer.callbacks.arguments import bad_argument, check_device, is_int, is_number
from trainer.callbacks.callback import Callback
from trainer.callbacks.module_average import AvgFn, ModuleAverage
from trainer.errors import ConfigurationError
from trainer.trainer.optimizer_config import (
    SchedulerConfig,
)  # TODO(trainer.py): public export wanted

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["StochasticWeightAveraging"]


class StochasticWeightAveraging(Callback):
    """Stochastic Weight Averaging (Izmailov et al., 2018) with Lightning's arguments.

    From epoch ``swa_epoch_start`` on, the learning rate follows ``torch.optim.swa_utils.SWALR``
    (annealed from the current value to ``swa_lrs`` over ``annealing_epochs`` epochs; it replaces
    the first scheduler of ``configure_optimizers``), and the weights at the end of each of these
    epochs, the last one included, are averaged with ``AveragedModel``. When fit completes its
    ``max_epochs``, the module receives the average and its BatchNorm statistics are recomputed
    with ``update_bn`` over the train dataloader (the module's ``forward`` receives ``batch[0]``
    when a batch is a list or tuple). A fit that stops earlier (``max_steps``, ``max_time``,
    ``should_stop``) keeps its trained weights, so it can be resumed; the average is saved in
    checkpoints (``state_dict``: the averaged tensors, ``n_averaged`` and the SWALR state).

    Args:
        swa_lrs: the SWA learning rate, one float for every parameter group or a list with one
            per group.
        swa_epoch_start: an int ``k >= 1`` starts at the k-th epoch (counting from 1); a float in
            (0, 1) starts at epoch ``int(swa_epoch_start * max_epochs)`` (counting from 1).
        annealing_epochs: epochs of the annealing from the current to the SWA learning rate.
        annealing_strategy: "cos" or "linear".
        avg_fn: ``(averaged, current, num_averaged) -> Tensor``; default the running mean.
        device: where the average lives ("cpu" saves accelerator memory); None: the module's.

    Raises:
        ConfigurationError: an argument is out of range (the message names it), the Trainer has
            no ``max_epochs`` bound, or ``configure_optimizers`` returned several optimizers.

    Examples:
        >>> swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=8)
        >>> Trainer(max_epochs=10, callbacks=[swa]).fit(module)
        >>> # epochs 8, 9 and 10 ran at lr 0.01 (annealed over 10 epochs with the defaults);
        >>> # module now holds the mean of the weights at the end of those three epochs.
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: str = "cos",
        avg_fn: AvgFn | None = None,
        device: torch.device | str | None = "cpu",
    ) -> None:
        owner = "StochasticWeightAveraging"
        lrs = swa_lrs if isinstance(swa_lrs, list) else [swa_lrs]
        if not lrs or not all(is_number(lr) and lr > 0 for lr in lrs):
            raise bad_argument(
                owner, "swa_lrs", swa_lrs, "a float > 0, or a list with one per group"
            )
        if not (
            (is_int(swa_epoch_start) and swa_epoch_start >= 1)
            or (isinstance(swa_epoch_start, float) and 0.0 < swa_epoch_start < 1.0)
        ):
            raise bad_argument(
                owner,
                "swa_epoch_start",
                swa_epoch_start,
                "an int >= 1 (the epoch, counting from 1) or a float in (0, 1) (of max_epochs)",
            )
        if not is_int(annealing_epochs) or annealing_epochs < 0:
            raise bad_argument(owner, "annealing_epochs", annealing_epochs, "an int >= 0")
        if annealing_strategy not in ("cos", "linear"):
            raise bad_argument(owner, "annealing_strategy", annealing_strategy, "'cos' or 'linear'")
        if avg_fn is not None and not callable(avg_fn):
            raise bad_argument(
                owner, "avg_fn", avg_fn, "a function (averaged, current, n) -> Tensor"
            )
        self.swa_lrs = swa_lrs
        self.swa_epoch_start = swa_epoch_start
        self.annealing_epochs = annealing_epochs
        self.annealing_strategy = annealing_strategy
        self.avg_fn = avg_fn
        self.device = check_device("StochasticWeightAveraging", device)
        self._average: ModuleAverage | None = None
        self._scheduler: SWALR | None = None
        self._scheduler_state: dict[str, Any] | None = None
        self._swa_start = 0  # 0-based epoch index, resolved at on_fit_start
        self._latest_update_epoch = -1  # the epoch whose end-of-epoch weights were last averaged
        self._pending: dict[str, Any] | None = None  # checkpoint state, applied at on_fit_start

    @property
    def swa_start(self) -> int:
        """The first epoch of averaging, 0-based (resolved when fit starts)."""
        return self._swa_start

    @property
    def n_averaged(self) -> int:
        """How many end-of-epoch weights the average holds."""
        return 0 if self._average is None else self._average.n_averaged

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._check_trainer(trainer)
        self._check_forward(module)
        start = self.swa_epoch_start
        first = start if isinstance(start, int) else int(start * trainer.max_epochs)
        self._swa_start = max(first - 1, 0)  # 0-based
        self._average = ModuleAverage(
            module, device=self.device, use_buffers=False, avg_fn=self.avg_fn
        )
        self._scheduler, self._scheduler_state, self._latest_update_epoch = None, None, -1
        pending, self._pending = self._pending, None
        if pending is not None:
            self._average.load_averaged(pending["average"], pending["n_averaged"])
            self._latest_update_epoch = pending["latest_update_epoch"]
            self._scheduler_state = pending["scheduler"]

    def _check_trainer(self, trainer: Trainer) -> None:
        name, optimizers = type(self).__name__, len(trainer.optimizers)
        if trainer.max_epochs in (None, -1):
            raise ConfigurationError(
                f"{name} averages up to max_epochs: set Trainer(max_epochs=...)."
            )
        if optimizers != 1:
            raise ConfigurationError(
                f"{name} works with one optimizer; configure_optimizers returned {optimizers}."
            )
        if len(trainer.lr_scheduler_configs) > 1:
            raise ConfigurationError(
                f"{name} replaces the scheduler with SWALR; configure_optimizers returned "
                f"{len(trainer.lr_scheduler_configs)} schedulers. Return at most one."
            )
        groups = len(trainer.optimizers[0].param_groups)
        if isinstance(self.swa_lrs, list) and len(self.swa_lrs) != groups:
            raise bad_argument(
                type(self).__name__, "swa_lrs", self.swa_lrs, f"one lr for each of {groups} groups"
            )

    def _check_forward(self, module: TrainModule) -> None:
        """Refuse now, not after the last epoch, a module whose BatchNorm statistics the end of
        fit could not recompute (`_update_batch_norm` calls its ``forward``)."""
        batch_norm = torch.nn.modules.batchnorm._BatchNorm  # noqa: SLF001 - what update_bn resets
        has_batch_norm = any(isinstance(layer, batch_norm) for layer in module.modules())
        if has_batch_norm and type(module).forward is torch.nn.Module.forward:
            raise ConfigurationError(
                f"{type(self).__name__} recomputes the BatchNorm statistics of the averaged "
                f"weights when fit ends by calling {type(module).__name__}.forward(batch[0]) over "
                "the train dataloader; the module has BatchNorm layers and no forward. Implement "
                "forward(self, x) (Lightning runs training_step in an extra epoch instead)."
            )

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        epoch = trainer.current_epoch
        if epoch >= self._swa_start and self._scheduler is None:
            self._install_scheduler(trainer)
        # Averaging at the start of the next epoch (not at the end of this one) counts only
        # epochs that completed: a fit stopped mid-epoch and resumed averages that epoch once.
        self._update(epoch - 1)

    def _install_scheduler(self, trainer: Trainer) -> None:
        self._scheduler = SWALR(
            trainer.optimizers[0],
            swa_lr=self.swa_lrs,
            anneal_epochs=self.annealing_epochs,
            anneal_strategy=self.annealing_strategy,  # type: ignore[arg-type]  # checked in __init__
        )
        if self._scheduler_state is not None:
            self._scheduler.load_state_dict(self._scheduler_state)
        config = SchedulerConfig(self._scheduler, interval="epoch", frequency=1)
        if trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs[0] = config
        else:
            trainer.lr_scheduler_configs.append(config)

    def _update(self, finished_epoch: int) -> None:
        if self._average is None or finished_epoch < self._swa_start:
            return
        if finished_epoch > self._latest_update_epoch:
            self._average.update()
            self._latest_update_epoch = finished_epoch

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._average is None or trainer.current_epoch < trainer.max_epochs:
            return  # stopped early: keep the trained weights (resumable); the average is saved
        self._update(trainer.current_epoch - 1)
        if self._average.n_averaged > 0:
            self._average.copy_to_module()
            self._update_batch_norm(trainer, module)

    def _update_batch_norm(self, trainer: Trainer, module: TrainModule) -> None:
        loader = trainer.train_dataloader
        if loader is None:
            return
        try:
            with torch.no_grad(), trainer.accelerator.autocast():
                update_bn(loader, module)
        except NotImplementedError as err:
            raise ConfigurationError(
                f"StochasticWeightAveraging recomputes BatchNorm statistics by calling "
                f"{type(module).__name__}.forward(batch[0]) over the train dataloader, and "
                f"forward is not implemented ({err}). Implement forward(self, x)."
            ) from err

    def state_dict(self) -> dict[str, Any]:
        if self._average is None:
            return {}
        return {
            "n_averaged": self._average.n_averaged,
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler": self._scheduler.state_dict()
            if self._scheduler is not None
            else self._scheduler_state,
            "average": self._average.tensors(averaged=True),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict) if state_dict else None
