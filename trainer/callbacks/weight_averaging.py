"""StochasticWeightAveraging: an average of the weights of the last epochs, with the SWA learning
rate, on Lightning 2.6's schedule (WeightAveraging and EMAWeightAveraging, averaged after steps,
are in ``step_averaging.py``).

This module owns when the average is updated, when it goes into the module (end of fit), the
extra epoch that recomputes BatchNorm statistics, and how the average travels in checkpoints.
The arithmetic is torch's own: ``torch.optim.swa_utils.AveragedModel`` and ``SWALR``. It does
not own the loop: the Trainer steps the SWALR scheduler like any "epoch" scheduler; for the
BatchNorm epoch the callback adds one epoch to ``max_epochs`` and turns the fit loop's backward
off (``skip_backward``), as Lightning's callback does with its fit loop.

The average itself (the ``AveragedModel`` and swapping it in and out) is a `ModuleAverage`
(``trainer/callbacks/module_average.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import SWALR

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

_BatchNorm = torch.nn.modules.batchnorm._BatchNorm  # noqa: SLF001 - what SWA resets


class StochasticWeightAveraging(Callback):
    """Stochastic Weight Averaging (Izmailov et al., 2018) with Lightning 2.6's arguments and
    schedule.

    From epoch ``swa_epoch_start`` on, the learning rate follows ``torch.optim.swa_utils.SWALR``
    (annealed from the current value to ``swa_lrs`` over ``annealing_epochs`` epochs; it replaces
    the first scheduler of ``configure_optimizers``), and at the start of each epoch from that
    one to the last, the module's weights are folded into an ``AveragedModel`` (as in Lightning:
    the weights the epoch starts from, so the last epoch's own training is not in the average).
    When fit has run all its ``max_epochs``, the module receives the average. A module with
    BatchNorm layers gets one more epoch (``max_epochs`` + 1 while fit runs, as in Lightning):
    it starts from the average with the BatchNorm statistics reset, runs ``training_step`` on
    every batch without backward, so the statistics become the cumulative mean over the train
    data, and counts one optimizer step, which changes no weight (Lightning's takes one with
    the last SWA step's gradients). A fit that stops earlier (``max_steps``, ``max_time``,
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
        ConfigurationError: an argument is out of range (the message names it), a float
            ``swa_epoch_start`` with ``max_epochs=-1``, or ``configure_optimizers`` returned
            several optimizers or schedulers.

    Examples:
        >>> swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=8)
        >>> Trainer(max_epochs=10, callbacks=[swa]).fit(module)
        >>> # epochs 8, 9 and 10 ran at lr 0.01 (annealed over 10 epochs with the defaults);
        >>> # module now holds the mean of the weights those three epochs started from.
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
        self._swa_end: float = math.inf  # the last averaged epoch, 0-based; inf: max_epochs=-1
        self._latest_update_epoch = -1  # the epoch whose starting weights were last averaged
        self._pending: dict[str, Any] | None = None  # checkpoint state, applied at on_fit_start
        self._added_epoch = False  # max_epochs + 1 for the BatchNorm epoch, during fit
        self._momenta: dict[torch.nn.Module, float | None] = {}  # BatchNorm epoch: put back
        self._accumulation: int | None = None  # accumulate_grad_batches before the BN epoch

    @property
    def swa_start(self) -> int:
        """The first epoch of averaging, 0-based (resolved when fit starts)."""
        return self._swa_start

    @property
    def n_averaged(self) -> int:
        """How many epochs' starting weights the average holds."""
        return 0 if self._average is None else self._average.n_averaged

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._check_trainer(trainer)
        start, max_epochs = self.swa_epoch_start, trainer.max_epochs
        first = start if isinstance(start, int) else int(start * max_epochs)
        self._swa_start = max(first - 1, 0)  # 0-based
        self._swa_end = math.inf if max_epochs == -1 else max_epochs - 1
        has_batch_norm = any(isinstance(layer, _BatchNorm) for layer in module.modules())
        self._added_epoch = has_batch_norm and max_epochs != -1
        if self._added_epoch:
            trainer.max_epochs = max_epochs + 1  # the BatchNorm epoch; undone at on_train_end
        self._average = ModuleAverage(
            module, device=self.device, use_buffers=False, avg_fn=self.avg_fn
        )
        self._scheduler, self._scheduler_state, self._latest_update_epoch = None, None, -1
        pending, self._pending = self._pending, None
        if pending is not None:
            self._average.load_averaged(pending["average"], pending["n_averaged"])
            self._latest_update_epoch = pending["latest_update_epoch"]
            if "averages_epoch_starts" not in pending:  # saved before 2026-11-27: epoch ends
                self._latest_update_epoch += 1
            self._scheduler_state = pending["scheduler"]

    def _check_trainer(self, trainer: Trainer) -> None:
        name, optimizers = type(self).__name__, len(trainer.optimizers)
        if trainer.max_epochs in (None, -1) and isinstance(self.swa_epoch_start, float):
            raise ConfigurationError(
                f"{name}(swa_epoch_start={self.swa_epoch_start}) is a share of max_epochs, and "
                "the Trainer has no max_epochs: set Trainer(max_epochs=...) or pass the epoch "
                "as an int."
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

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        epoch = trainer.current_epoch
        is_averaging = self._swa_start <= epoch <= self._swa_end
        if is_averaging and self._scheduler is None:
            self._install_scheduler(trainer)
        # The guard also keeps a fit resumed inside an epoch from averaging that epoch twice.
        if is_averaging and epoch > self._latest_update_epoch and self._average is not None:
            self._average.update()
            self._latest_update_epoch = epoch
        if epoch == self._swa_end + 1 and self._average is not None:
            self._start_batch_norm_epoch(trainer)

    def _install_scheduler(self, trainer: Trainer) -> None:
        optimizer = trainer.optimizers[0]
        lrs = (
            self.swa_lrs
            if isinstance(self.swa_lrs, list)
            else [self.swa_lrs] * len(optimizer.param_groups)
        )
        for lr, group in zip(lrs, optimizer.param_groups, strict=True):
            group["initial_lr"] = lr  # Lightning's; SWALR's last_epoch below requires it
        self._scheduler = SWALR(
            optimizer,
            swa_lr=lrs,
            anneal_epochs=self.annealing_epochs,
            anneal_strategy=self.annealing_strategy,  # type: ignore[arg-type]  # checked in __init__
            last_epoch=trainer.max_epochs if self.annealing_strategy == "cos" else -1,
        )
        if self._scheduler_state is not None:
            self._scheduler.load_state_dict(self._scheduler_state)
        config = SchedulerConfig(self._scheduler, interval="epoch", frequency=1)
        if trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs[0] = config
        else:
            trainer.lr_scheduler_configs.append(config)

    def _start_batch_norm_epoch(self, trainer: Trainer) -> None:
        """The module takes the average; its BatchNorm statistics restart and, with momentum
        None, become the cumulative mean over the epoch's batches; no backward, one optimizer
        step for the whole epoch (which steps nothing)."""
        assert self._average is not None
        module = self._average.module
        self._average.copy_to_module()
        self._momenta = {}
        for layer in module.modules():
            if isinstance(layer, _BatchNorm):
                if layer.running_mean is not None:
                    layer.running_mean.zero_()
                    layer.running_var.fill_(1)  # type: ignore[union-attr]
                    layer.num_batches_tracked.zero_()  # type: ignore[union-attr]
                self._momenta[layer] = layer.momentum
                layer.momentum = None
        trainer.fit_loop.skip_backward = True  # Lightning's callback, too, drives its fit loop
        self._accumulation = trainer.accumulate_grad_batches
        batches = trainer.num_training_batches
        if isinstance(batches, int) and batches > 0:
            trainer.accumulate_grad_batches = batches

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        trainer.fit_loop.skip_backward = False

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._average is None:
            return
        finished = trainer.current_epoch - 1  # the fit counted its last epoch already
        self._put_back(trainer)
        if finished == self._swa_end + 1:
            return  # the BatchNorm epoch ran from the average, which the module holds
        if finished == self._swa_end or self._swa_end == math.inf:
            self._average.copy_to_module()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._put_back(trainer)  # the Trainer may fit again

    def _put_back(self, trainer: Trainer) -> None:
        """Undo what the BatchNorm epoch changed: max_epochs, accumulation, BatchNorm momenta."""
        if self._added_epoch:
            trainer.max_epochs -= 1  # type: ignore[operator]  # added in on_fit_start
            self._added_epoch = False
        if self._accumulation is not None:
            trainer.accumulate_grad_batches = self._accumulation
            self._accumulation = None
        for layer, momentum in self._momenta.items():
            layer.momentum = momentum
        self._momenta = {}
        trainer.fit_loop.skip_backward = False

    def state_dict(self) -> dict[str, Any]:
        if self._average is None:
            return {}
        return {
            "n_averaged": self._average.n_averaged,
            "latest_update_epoch": self._latest_update_epoch,
            "averages_epoch_starts": True,
            "scheduler": self._scheduler.state_dict()
            if self._scheduler is not None
            else self._scheduler_state,
            "average": self._average.tensors(averaged=True),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict) if state_dict else None
