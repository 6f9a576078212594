"""The Trainer's public read-only facts: progress, ranks, precision, loggers, metrics, limits.

A base class of `Trainer`, so that ``trainer.py`` holds only the lifecycle of a call (set up,
run a loop, tear down). Every property reads state the Trainer's constructor and ``_setup``
create; none changes anything, except the ``accumulate_grad_batches`` setter.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import ConfigurationError
from trainer.trainer.metrics import merge_layers, to_float
from trainer.trainer.options import (
    check_accumulation,
    is_checkpoint_callback,
    is_instance_named,
    is_progress_bar,
)

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator
    from trainer.callbacks.callback import Callback
    from trainer.loggers.logger import Logger
    from trainer.precision import Precision
    from trainer.strategies import Strategy
    from trainer.trainer.metrics import MetricStore
    from trainer.trainer.module import TrainModule
    from trainer.trainer.run import Progress, TrainerState

__all__ = ["TrainerProperties"]


class TrainerProperties:
    """Lightning's read-only Trainer attributes, computed from the Trainer's own state."""

    # The checkpoint the last fit / validate / test / predict restored ("last" and "best"
    # resolved), or None; set by trainer.trainer.checkpoint_state.restore_from.
    ckpt_path: str | None = None

    # The dataset indices of the samples of the batch trainer.predict is on (what
    # BasePredictionWriter receives as batch_indices; Lightning's
    # trainer.predict_loop.current_batch_indices), or None; set by the evaluation loop for
    # each predict batch (after a predict, its last batch's).
    predict_batch_indices: list[int] | None = None

    # set by Trainer.__init__ / Trainer._setup
    accelerator: Accelerator
    progress: Progress
    loggers: list[Logger]
    callbacks: list[Callback]
    default_root_dir: str
    num_training_batches: float
    max_epochs: int | None
    max_steps: int
    num_nodes: int
    limit_batches: dict[str, int | float | None]
    _accumulate_grad_batches: int
    _stores: dict[str, MetricStore]
    _restored_metrics: dict[str, float]
    _callback_metrics: dict[str, torch.Tensor]
    _loaders: dict[str, Any]
    _wrapped_model: torch.nn.Module | None
    _router: torch.nn.Module | None
    _fit_loop: Any  # trainer.trainer.fit_loop.FitLoop, during fit
    module: TrainModule | None
    state: TrainerState

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step; settable between epochs (GradientAccumulationScheduler)."""
        return self._accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        self._accumulate_grad_batches = check_accumulation(value)
        self.accelerator.gradient_accumulation_steps = self._accumulate_grad_batches

    # ---- read-only facts -------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.progress.global_step

    @property
    def current_epoch(self) -> int:
        return self.progress.epoch

    @property
    def strategy(self) -> Strategy:
        return self.accelerator.strategy

    @property
    def precision_plugin(self) -> Precision:
        return self.accelerator.precision

    @property
    def precision(self) -> str:
        """The precision mode's name, e.g. "bf16-mixed"."""
        return self.accelerator.precision.name

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def node_rank(self) -> int:
        """This machine's index among the job's machines (0 on one machine)."""
        return getattr(self.strategy, "node_rank", 0)

    @property
    def num_devices(self) -> int:
        """Processes (devices) per machine."""
        return max(1, self.world_size // max(1, self.num_nodes))

    # The limit_*_batches as resolved (fast_dev_run and overfit_batches replace them, as in
    # Lightning): a count, or a fraction of each loader (1.0: all of it).
    limit_train_batches = property(lambda self: _limit(self.limit_batches["train"]))
    limit_val_batches = property(lambda self: _limit(self.limit_batches["validation"]))
    limit_test_batches = property(lambda self: _limit(self.limit_batches["test"]))
    limit_predict_batches = property(lambda self: _limit(self.limit_batches["predict"]))

    @property
    def training(self) -> bool:
        """Whether the training loop runs now (not a validation inside ``fit``)."""
        return self.state.running == "train"

    @property
    def validating(self) -> bool:
        """Whether a validation runs now (``validate()``, or one inside ``fit``)."""
        return self.state.running == "validate"

    @property
    def testing(self) -> bool:
        return self.state.running == "test"

    @property
    def predicting(self) -> bool:
        return self.state.running == "predict"

    @property
    def evaluating(self) -> bool:
        """Whether a validation, a test or the sanity check runs now."""
        return self.state.running in ("validate", "test", "sanity_check")

    @property
    def lightning_module(self) -> TrainModule | None:
        """Lightning's name for ``trainer.module``, for callbacks ported unchanged."""
        return self.module

    @property
    def logger(self) -> Logger | None:
        """The first logger, or None."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """Where the first logger writes, else ``default_root_dir``."""
        directory = self.logger.log_dir if self.logger is not None else None
        return os.fspath(directory) if directory is not None else self.default_root_dir

    @property
    def early_stopping_callback(self) -> Callback | None:
        """The first EarlyStopping among the callbacks, or None."""
        return next(iter(self.early_stopping_callbacks), None)

    @property
    def early_stopping_callbacks(self) -> list[Callback]:
        """Every EarlyStopping among the callbacks, in order."""
        return [cb for cb in self.callbacks if is_instance_named(cb, "EarlyStopping")]

    @property
    def interrupted(self) -> bool:
        """Whether the last call ended by an interruption: Ctrl-C, or a preemption signal's
        exit with status 0 (after its checkpoint)."""
        return self.state.status == "interrupted"

    @property
    def is_last_batch(self) -> bool:
        """Whether the training batch in progress is its epoch's last (after ``fit``: whether
        its last batch was)."""
        train = self._loaders.get("train")  # a later validate / test / predict: none (False)
        return bool(getattr(train, "end_of_dataloader", False))

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank zero only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    @property
    def checkpoint_callback(self) -> Callback | None:
        """The first ModelCheckpoint among the callbacks, or None."""
        return next((cb for cb in self.callbacks if is_instance_named(cb, "ModelCheckpoint")), None)

    @property
    def checkpoint_callbacks(self) -> list[Callback]:
        """Every checkpointing callback (``ModelCheckpoint``, ``OnExceptionCheckpoint``), in order."""
        return [cb for cb in self.callbacks if is_checkpoint_callback(cb)]

    @property
    def progress_bar_callback(self) -> Callback | None:
        """The progress bar among the callbacks (``RichProgressBar``, ...), or None."""
        return next((cb for cb in self.callbacks if is_progress_bar(cb)), None)

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Latest value of every logged metric, as tensors, for callbacks (Lightning's keys:
        ``name``, ``name_step`` and ``name_epoch``; validation and test epoch values only).

        One dict for the whole call, as Lightning's: what a callback puts in it (e.g.
        `LearningRateMonitor`'s rates) stays until a logged value of that name replaces it.
        """
        layers = [(-1, dict(self._restored_metrics))]
        for stage, store in self._stores.items():
            layers.extend(store.callback_items(is_training=stage == "train"))
        self._callback_metrics.update(self._as_tensors(merge_layers(layers)))
        return self._callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """Latest value of every metric logged with ``logger=True`` in this run, as tensors
        (as Lightning: whether or not ``log_every_n_steps`` has sent it to a logger yet)."""
        layers = [layer for store in self._stores.values() for layer in store.logged_items()]
        return self._as_tensors(merge_layers(layers))

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Metrics logged with ``prog_bar=True``, as floats (reading them syncs the device)."""
        layers = [layer for store in self._stores.values() for layer in store.bar_items()]
        return {k: to_float(v) for k, v in merge_layers(layers).items()}

    @staticmethod
    def _as_tensors(values: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Logged values as tensors (a Python number becomes a 0-dim float tensor)."""
        return {
            k: v if isinstance(v, torch.Tensor) else torch.tensor(float(v))
            for k, v in values.items()
        }

    @property
    def train_dataloader(self) -> Any:
        """The prepared train dataloader of the current fit, or None."""
        return self._loaders.get("train")

    @property
    def val_dataloaders(self) -> Any:
        """The prepared validation dataloader(s) of the current call: one, a list, or None."""
        return _one_or_list(self._loaders.get("validation"))

    @property
    def test_dataloaders(self) -> Any:
        """The prepared test dataloader(s) of the current call: one, a list, or None."""
        return _one_or_list(self._loaders.get("test"))

    @property
    def predict_dataloaders(self) -> Any:
        """The prepared predict dataloader(s) of the current call: one, a list, or None."""
        return _one_or_list(self._loaders.get("predict"))

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """Per validation dataloader of the last ``fit``, the batches its sanity check reads
        ([] before a fit with validation data)."""
        return self.__dict__.get("_num_sanity_val_batches", [])

    @num_sanity_val_batches.setter
    def num_sanity_val_batches(self, counts: list[int | float]) -> None:
        """Set by `trainer.trainer.loaders.load_stage` when a fit prepares its validation data."""
        self.__dict__["_num_sanity_val_batches"] = counts

    @property
    def enable_validation(self) -> bool:
        """Whether ``fit`` validates: a validation dataloader, ``validation_step`` and
        ``limit_val_batches`` above 0."""
        module = self.module
        return (
            bool(self._loaders.get("validation"))
            and module is not None
            and callable(getattr(module, "validation_step", None))
            and self.limit_val_batches > 0
        )

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` the samplers shard with; None on one device."""
        strategy = self.strategy
        return None if strategy.world_size == 1 else strategy.distributed_sampler_kwargs

    @property
    def device_ids(self) -> list[int]:
        """The indices of this machine's devices, one per process (``[0, 1]`` for 2 processes;
        ``[1]`` for one process on ``cuda:1``)."""
        device = self.accelerator.device
        if self.num_devices == 1 and device.index is not None:
            return [device.index]
        return list(range(self.num_devices))

    @property
    def received_sigterm(self) -> bool:
        """Whether SIGTERM reached this process during the current ``fit`` (it then saves a
        checkpoint and stops after the batch; docs/checkpointing.md, Preemption)."""
        import signal

        loop = self._fit_loop
        return loop is not None and loop.received_signal.signum == signal.SIGTERM

    @property
    def fit_loop(self) -> Any:
        """The running ``fit``'s loop (`trainer.trainer.fit_loop.FitLoop`); outside ``fit`` a
        `trainer.trainer.fit_loop.FitLimits`.

        Lightning's ``trainer.fit_loop``: ``max_epochs``, ``min_epochs``, ``max_steps`` and
        ``min_steps`` read and write the Trainer's; during fit callbacks may also set
        ``skip_backward`` (``training_step`` runs, zero_grad, backward and the optimizer step do
        not; the step is counted), which StochasticWeightAveraging's BatchNorm epoch uses.
        """
        if self._fit_loop is not None:
            return self._fit_loop
        from trainer.trainer.fit_loop import FitLimits

        return FitLimits(self)

    @property
    def scaler(self) -> Any:
        """The gradient scaler of ``"16-mixed"`` (a ``torch.amp.GradScaler``), else None."""
        return getattr(self.precision_plugin, "scaler", None)

    def init_module(
        self, empty_init: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Build a module inside: its tensors are made on the Trainer's device in the precision's
        dtype; ``empty_init=True`` also skips weight initialization (load weights next).

        Examples:
            >>> with trainer.init_module():
            ...     model = GPT(config)  # bf16 on the GPU under precision="bf16-true"
        """
        from trainer.trainer.init_module import init_module_context

        return init_module_context(self, empty_init)  # type: ignore[arg-type]

    @property
    def model(self) -> torch.nn.Module | None:
        """The prepared model: ``trainer.model("training_step", batch, batch_idx)`` runs a step
        through the engine's wrapper (DDP, FSDP), as the loop does."""
        return self._wrapped_model if self._router is not None else None

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps ``fit`` will take (``inf`` when unbounded); needs the train loader.

        ``max_epochs=0`` counts one epoch, as Lightning does, so a scheduler sized from it in
        ``configure_optimizers`` (``OneCycleLR(total_steps=...)``) can be built."""
        if "train" not in self._loaders:
            raise ConfigurationError(
                "trainer.estimated_stepping_batches is known once fit has set up its train "
                "dataloader: read it in configure_optimizers or later."
            )
        batches = self.num_training_batches  # inf: a loader without length (IterableDataset)
        total = math.inf
        if math.isfinite(batches) and self.max_epochs not in (None, -1):
            total = math.ceil(batches / self.accumulate_grad_batches) * max(self.max_epochs, 1)
        return min(total, self.max_steps) if self.max_steps not in (None, -1) else total


def _limit(value: int | float | None) -> int | float:
    return 1.0 if value is None else value


def _one_or_list(loaders: list[Any] | None) -> Any:
    if not loaders:
        return None
    return loaders[0] if len(loaders) == 1 else list(loaders)
