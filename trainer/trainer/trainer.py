"""The Trainer: owns the loop (fit / validate / test / predict) and calls the hooks.

The loop is plain methods, one per stage, in the order of DESIGN §3: ``_setup``,
``_run_sanity_check``, ``_train_epoch``, ``_train_batch``, ``_optimizer_step``, ``_eval_epoch``.
Everything device-, precision- and process-related goes through ``self.accelerator``; callbacks
and loggers see only public attributes. Hooks go through one dispatcher, ``_call_hook``.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader

from trainer.accelerator.accelerator import Accelerator
from trainer.accelerator.launchers import relaunch_with_torchrun
from trainer.callbacks.callback import Callback
from trainer.errors import AnomalyError, ConfigurationError, HookResultError, describe
from trainer.loggers.logger import Logger
from trainer.plugins.async_checkpoint import PendingSave, find_checkpoint_io
from trainer.precision import Precision, resolve_precision
from trainer.profilers import Profiler, resolve_profiler
from trainer.runtime.configs import DataLoaderConfiguration
from trainer.runtime.seed import get_rng_states, set_rng_states
from trainer.strategies import Strategy, detect_environment, resolve_strategy
from trainer.trainer import profiling
from trainer.trainer.checkpoint_state import (
    dump_checkpoint,
    load_checkpoint,
    resolve_ckpt_path,
    restore_checkpoint,
)
from trainer.trainer.hooks import CALLBACK_HOOKS, CALLBACK_ONLY_HOOKS, MONITORING_CALLBACKS
from trainer.trainer.metrics import MetricStore, to_float
from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.module_hooks import ModuleHooks, warn_on_lightning_hooks
from trainer.trainer.optimizer_config import (
    SchedulerConfig,
    parse_optimizer_config,
    step_schedulers,
)
from trainer.trainer.options import (
    apply_benchmark,
    build_callbacks,
    build_loggers,
    check_barebones_profiler,
    check_clip,
    check_fast_dev_run,
    check_max_steps,
    check_module_for_fit,
    check_positive_int,
    check_sanity_steps,
    check_sync_batchnorm,
    check_val_interval,
    default_max_epochs,
    device_count,
    is_instance_named,
    overrides,
    parse_max_time,
    resolve_device,
    resolve_limit,
    resolve_plugins,
    resolve_root_dir,
    safe_len,
    warn_on_empty_epoch,
    warn_on_empty_loader,
)
from trainer.trainer.preemption import catch_preemption_signals, save_and_exit

__all__ = ["Progress", "Trainer", "TrainerState"]

_STEP_NAMES = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}
_STAGE_OF = {"validation": "validate", "test": "test", "predict": "predict"}


@dataclass
class Progress:
    """Where training stands; saved as-is in checkpoints. One counter per fact."""

    epoch: int = 0  # epochs completed; the current epoch's index while training
    global_step: int = 0  # optimizer steps taken
    batch_idx: int = 0  # next batch index inside the current epoch
    last_val_step: int = -1  # global step of the last validation during fit


@dataclass
class TrainerState:
    """What the Trainer is doing: ``stage`` ("fit", "validate", "test", "predict") and status."""

    stage: str | None = None
    status: str = "initializing"  # "running", "finished", "interrupted", "failed"


class _StepRouter(torch.nn.Module):
    """Routes ``forward(step_name, ...)`` to the module's step, so engine wrappers (DDP) see it."""

    def __init__(self, module: TrainModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, step_name: str, *args: Any) -> Any:
        return getattr(self.module, step_name)(*args)


class Trainer:
    """Runs a `TrainModule`: the loop, the hooks, logging and stopping.

    Arguments follow Lightning's names (see DESIGN §3 and docs/trainer.md for each).

    Examples:
        >>> trainer = Trainer(max_epochs=3, precision="bf16-mixed", log_every_n_steps=10)
        >>> trainer.fit(module, train_loader, val_loader)
        >>> trainer.callback_metrics["val/acc"]
        tensor(0.9600)
    """

    def __init__(
        self,
        max_epochs: int | None = None,
        max_steps: int = -1,
        max_time: str | dt.timedelta | dict[str, int] | None = None,
        strategy: str | Strategy = "auto",
        accelerator: str = "auto",
        devices: int | str | list[int] = "auto",
        num_nodes: int = 1,
        precision: str | int | Precision = "32-true",
        callbacks: list[Callback] | Callback | None = None,
        logger: bool | Logger | Iterable[Logger] | None = True,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        val_check_interval: int | float = 1.0,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int = 2,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        log_every_n_steps: int = 50,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        enable_model_summary: bool = True,
        default_root_dir: str | os.PathLike[str] | None = None,
        deterministic: bool = False,
        fast_dev_run: bool | int = False,
        detect_anomaly: bool = False,
        use_distributed_sampler: bool = True,
        compile: bool | dict[str, Any] = False,
        seed: int | None = None,
        profiler: str | Profiler | None = None,
        sync_batchnorm: bool = False,
        benchmark: bool | None = None,
        barebones: bool = False,
        plugins: Any = None,
    ) -> None:
        if barebones:  # Lightning's: everything that costs speed is off
            logger, enable_progress_bar, enable_model_summary = False, False, False
            enable_checkpointing = False
            check_barebones_profiler(profiler)
        self.barebones = barebones
        self.default_root_dir = resolve_root_dir(default_root_dir)
        self.fast_dev_run = check_fast_dev_run(fast_dev_run)
        dev_batches = self.fast_dev_run or None
        max_steps = check_max_steps(max_steps)
        max_epochs = default_max_epochs(max_epochs, max_steps)
        self.max_epochs = 1 if dev_batches else max_epochs
        self.max_steps = dev_batches or max_steps
        self.max_time = parse_max_time(max_time)
        self._accumulate_grad_batches = check_positive_int(
            "accumulate_grad_batches", accumulate_grad_batches
        )
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = check_clip(gradient_clip_val, gradient_clip_algorithm)
        self.val_check_interval = 1.0 if dev_batches else check_val_interval(val_check_interval)
        self.check_val_every_n_epoch = (
            None
            if check_val_every_n_epoch is None
            else check_positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
        )
        self.num_sanity_val_steps = 0 if dev_batches else check_sanity_steps(num_sanity_val_steps)
        self.limit_batches = {
            "train": dev_batches or limit_train_batches,
            "validation": dev_batches or limit_val_batches,
            "test": dev_batches or limit_test_batches,
            "predict": dev_batches or limit_predict_batches,
        }
        self.log_every_n_steps = (
            1 if dev_batches else check_positive_int("log_every_n_steps", log_every_n_steps)
        )
        self.deterministic = deterministic
        self.detect_anomaly = detect_anomaly
        self.use_distributed_sampler = use_distributed_sampler
        self.compile = compile
        self.seed = seed
        self.num_nodes = check_positive_int("num_nodes", num_nodes)
        precision_plugin, environment = resolve_plugins(plugins)
        self.sync_batchnorm = check_sync_batchnorm(sync_batchnorm, accelerator, devices)
        self.accelerator = self._build_accelerator(
            strategy, accelerator, devices, precision_plugin or precision
        )
        if environment is not None and hasattr(self.strategy, "environment"):
            self.strategy.environment = environment
        apply_benchmark(benchmark, deterministic)
        self.profiler = resolve_profiler(profiler)
        self.checkpoint_io = find_checkpoint_io(plugins)  # AsyncCheckpointIO, or None: synchronous
        self.loggers = [] if dev_batches else build_loggers(logger, self.default_root_dir)
        self.enable_checkpointing = enable_checkpointing and not dev_batches
        self.callbacks = build_callbacks(
            callbacks, enable_progress_bar, enable_model_summary, self.enable_checkpointing
        )
        self.progress = Progress()
        self.state = TrainerState()
        self.should_stop = False
        self.sanity_checking = False
        self.module: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[Any] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self.num_training_batches: float = 0
        self.num_val_batches = 0
        self.num_test_batches = 0
        self.num_predict_batches = 0
        self._stores = {
            stage: MetricStore(self._reduce_for_logging)
            for stage in ("train", "validation", "test")
        }
        for store in self._stores.values():
            store.key_check = self._check_same_metric_keys
        self._hooks: dict[str, list[Callable[..., Any]]] = {}
        self._module_hook_functions: dict[str, Callable[..., Any]] = {}
        self._epoch_end_monitors: list[Callable[..., Any]] = []
        self._is_step_row_due = False  # a training step row waits for on_train_batch_end
        self._loaders: dict[str, Any] = {}
        self._start_time = 0.0
        self._previous_deterministic = torch.are_deterministic_algorithms_enabled()
        self._router: _StepRouter | None = None
        self._wrapped_model: torch.nn.Module | None = None
        self._is_train_loader_given = False
        self._pending_rng_state: dict[str, Any] | None = None  # applied when training resumes
        self._restored_metrics: dict[str, float] = {}  # callback_metrics of a resumed checkpoint
        self._received_signal: int | None = None  # SIGTERM/SIGUSR1 seen: save at the next step

    def _build_accelerator(
        self, strategy: Any, accelerator: str, devices: Any, precision: Any
    ) -> Accelerator:
        launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        if precision == "32-true" and launched != "no":  # `trainer launch --mixed_precision`
            precision = launched  # replaces only the default; an explicit choice stays
        plugin = resolve_precision(precision)
        if isinstance(strategy, Strategy):
            chosen = strategy
        elif strategy == "single" or (
            strategy in ("auto", None) and not detect_environment().is_distributed
        ):
            chosen = resolve_strategy("single", device=resolve_device(accelerator, devices))
        else:  # multi-process engines take the device type; the launcher gives the rank
            count = device_count(devices)
            if count > 1 and not detect_environment().is_distributed:
                relaunch_with_torchrun(count)  # re-runs this script under torchrun, then exits
            chosen = resolve_strategy(
                strategy, accelerator=None if accelerator == "auto" else accelerator
            )
        return Accelerator(
            mixed_precision=plugin,
            strategy=chosen,
            gradient_accumulation_steps=self._accumulate_grad_batches,
            step_scheduler_with_optimizer=False,
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        )

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step; settable between epochs (GradientAccumulationScheduler)."""
        return self._accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        self._accumulate_grad_batches = check_positive_int("accumulate_grad_batches", value)
        self.accelerator.gradient_accumulation_steps = value

    # ---- public read-only facts -------------------------------------------------------------
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
    def logger(self) -> Logger | None:
        """The first logger, or None."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """Where the first logger writes, else ``default_root_dir``."""
        directory = self.logger.log_dir if self.logger is not None else None
        return os.fspath(directory) if directory is not None else self.default_root_dir

    @property
    def checkpoint_callback(self) -> Callback | None:
        """The first ModelCheckpoint among the callbacks, or None."""
        return next((cb for cb in self.callbacks if is_instance_named(cb, "ModelCheckpoint")), None)

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Latest value of every logged metric, as tensors, for callbacks (Lightning's keys:
        ``name``, ``name_step`` and ``name_epoch``; validation and test epoch values only)."""
        merged: dict[str, Any] = dict(self._restored_metrics)
        for stage, store in self._stores.items():
            merged.update(store.callback_items(is_training=stage == "train"))
        return self._as_tensors(merged)

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """Latest value of every metric logged with ``logger=True`` in this run, as tensors
        (as Lightning: whether or not ``log_every_n_steps`` has sent it to a logger yet)."""
        merged: dict[str, Any] = {}
        for store in self._stores.values():
            merged.update(store.logged_items())
        return self._as_tensors(merged)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Metrics logged with ``prog_bar=True``, as floats (reading them syncs the device)."""
        items: dict[str, Any] = {}
        for store in self._stores.values():
            items.update(store.bar_items())
        return {k: to_float(v) for k, v in items.items()}

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
    def model(self) -> torch.nn.Module | None:
        """The prepared model: ``trainer.model("training_step", batch, batch_idx)`` runs a step
        through the engine's wrapper (DDP, FSDP), as the loop does."""
        return self._wrapped_model if self._router is not None else None

    def reset_train_dataloader(self) -> None:
        """Rebuild the train dataloader from the DataModule/TrainModule and prepare it again.

        For callbacks that change how data is loaded during ``on_fit_start`` (BatchSizeFinder).
        The new loader keeps the old one's shuffle seed and epoch; the global RNG is untouched.

        Raises:
            ConfigurationError: fit received the DataLoader directly, so it cannot be rebuilt.
        """
        if self._is_train_loader_given:
            raise ConfigurationError(
                "trainer.reset_train_dataloader(): fit() received the train DataLoader, which cannot be "
                "rebuilt. Provide train_dataloader() on the module or a DataModule instead."
            )
        old = self._loaders.get("train")
        rng = get_rng_states()  # preparing draws a seed; the old loader's is kept instead
        self._loaders["train"] = self._prepare_loader("train", None, required=True)
        set_rng_states(rng)
        if old is not None:
            self._loaders["train"].load_state_dict(old.state_dict())

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps ``fit`` will take (``inf`` when unbounded); needs the train loader."""
        if "train" not in self._loaders:
            raise ConfigurationError(
                "trainer.estimated_stepping_batches is known once fit has set up its train "
                "dataloader: read it in configure_optimizers or later."
            )
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        total = per_epoch * self.max_epochs if self.max_epochs not in (None, -1) else math.inf
        return min(total, self.max_steps) if self.max_steps not in (None, -1) else total

    # ---- entry points -------------------------------------------------------------------------
    def fit(
        self,
        module: TrainModule,
        train_dataloaders: DataLoader | None = None,
        val_dataloaders: DataLoader | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | None = None,
    ) -> None:
        """Train ``module``; validate along the way when it has ``validation_step``.

        Data comes from the arguments, else ``datamodule``, else the module's
        ``*_dataloader`` methods. ``ckpt_path`` ("last", "best" or a path) resumes training
        exactly where that checkpoint stopped.
        """
        self._attach(module, datamodule, "fit")
        try:
            with catch_preemption_signals(self):
                loaders = {"train": train_dataloaders, "validation": val_dataloaders}
                self._setup("fit", loaders, ckpt_path)
                self._run_sanity_check()
                self._call_hook("on_train_start")
                while not self._is_done():
                    self._train_epoch()
            self._call_hook("on_train_end")
            self._call_hook("on_fit_end")
        except BaseException as err:
            self._handle_exception(err, "fit")
            raise
        self._teardown("fit", "finished")

    def validate(
        self,
        module: TrainModule | None = None,
        dataloaders: DataLoader | None = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run one validation epoch; return ``[{metric: value}]``."""
        return self._run_eval("validation", module, dataloaders, ckpt_path, datamodule)

    def test(
        self,
        module: TrainModule | None = None,
        dataloaders: DataLoader | None = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run one test epoch; return ``[{metric: value}]``."""
        return self._run_eval("test", module, dataloaders, ckpt_path, datamodule)

    def predict(
        self,
        module: TrainModule | None = None,
        dataloaders: DataLoader | None = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
    ) -> list[Any]:
        """Run ``predict_step`` over the data; return its outputs, one per batch."""
        return self._run_eval("predict", module, dataloaders, ckpt_path, datamodule)

    def _run_eval(
        self,
        stage: str,
        module: TrainModule | None,
        dataloaders: Any,
        ckpt_path: str | None,
        datamodule: DataModule | None,
    ) -> Any:
        run_stage = _STAGE_OF[stage]
        module = module if module is not None else self.module
        if module is None:
            raise ConfigurationError(
                f"trainer.{run_stage}(): no module given and none was fitted before. Pass the "
                f"module: trainer.{run_stage}(module, dataloaders)."
            )
        self._attach(module, datamodule, run_stage)
        try:
            self._setup(run_stage, {stage: dataloaders}, ckpt_path)
            result = self._eval_epoch(stage)
        except BaseException as err:
            self._handle_exception(err, run_stage)
            raise
        self._teardown(run_stage, "finished")
        if stage == "predict":
            return result
        return [{k: to_float(v) for k, v in result.items()}]

    def save_checkpoint(
        self, filepath: str | os.PathLike[str], weights_only: bool = False
    ) -> PendingSave | None:
        """Write a checkpoint directory at ``filepath`` (atomically; see docs/checkpointing.md).

        Returns:
            None when written; with ``plugins=[AsyncCheckpointIO()]`` during ``fit``, the
            `trainer.plugins.PendingSave` being written in the background.

        Raises:
            ConfigurationError: no module is attached yet (call fit/validate/... first).
            CheckpointError: the write failed; an earlier checkpoint at ``filepath`` is intact.
        """
        if self.module is None:
            raise ConfigurationError(
                "trainer.save_checkpoint: no module is attached. Call trainer.fit(module, ...) first."
            )
        if self.checkpoint_io is not None:  # at most one save in flight: the previous ends first
            self.checkpoint_io.wait()
        if self._is_step_row_due:  # the row the checkpoint covers goes to the loggers first
            self._send_step_row()
        checkpoint = dump_checkpoint(self, weights_only=weights_only)
        self._call_hook("on_save_checkpoint", checkpoint)
        if self.checkpoint_io is not None:
            is_fitting = self.state.stage == "fit" and self.state.status == "running"
            return self.checkpoint_io.save_checkpoint(
                checkpoint, filepath, strategy=self.strategy, in_background=is_fitting
            )
        self.strategy.save_checkpoint(filepath, checkpoint)
        return None

    # ---- setup and teardown -----------------------------------------------------------------
    def _attach(self, module: TrainModule, datamodule: DataModule | None, stage: str) -> None:
        if not isinstance(module, TrainModule):
            raise ConfigurationError(
                f"trainer.{stage}(module={describe(module)}): expected a trainer.TrainModule "
                "subclass instance. Subclass TrainModule and implement training_step."
            )
        if stage == "fit":
            check_module_for_fit(module)
        if datamodule is not None and not isinstance(datamodule, DataModule):
            raise ConfigurationError(
                f"trainer.{stage}(datamodule={describe(datamodule)}): expected a trainer.DataModule."
            )
        self.module = module
        self.datamodule = datamodule
        module._trainer = self
        if datamodule is not None:
            datamodule.trainer = self
        self.state = TrainerState(stage=stage, status="running")
        self.should_stop = False
        self._hooks = self._build_hook_table(module)

    def _setup(self, stage: str, loaders: dict[str, Any], ckpt_path: Any = None) -> None:
        """Seed, set up data, hooks, model, optimizers, dataloaders; restore ``ckpt_path``."""
        self._start_time = time.monotonic()
        profiling.start(self, stage)
        module = self.module
        if self.seed is not None:
            from trainer.runtime.seed import seed_everything

            seed_everything(self.seed)
        self._previous_deterministic = torch.are_deterministic_algorithms_enabled()
        if self.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.datamodule is not None:
            if self.local_rank == 0:  # once per machine (downloads land on each machine's disk)
                self.datamodule.prepare_data()
            self.datamodule.setup(stage)
        for store in self._stores.values():  # metrics of an earlier run are not this run's
            store.reset()
        self._restored_metrics = {}
        warn_on_lightning_hooks(module)
        self._call_hook("setup", stage)
        with self.strategy.module_init_context():
            module.configure_model()
        if self.compile:
            options = self.compile if isinstance(self.compile, dict) else {}
            module.compile(**options)
        self._prepare_module(module)
        self._loaders = {}
        self._is_train_loader_given = loaders.get("train") is not None
        for name, given in loaders.items():  # before optimizers: schedulers may need the length
            self._loaders[name] = self._prepare_loader(
                name, given, required=name in ("train", "test", "predict")
            )
        if stage == "fit":
            self._configure_optimizers(module)
        module._metric_store = self._stores["train"]
        path = resolve_ckpt_path(self, ckpt_path, stage)
        if path is not None:
            restore_checkpoint(self, load_checkpoint(self, path), full=stage == "fit")
        profiling.expect_steps(self, stage)
        if stage == "fit":
            self._log_hyperparams()
            self._call_hook("on_fit_start")

    def _prepare_module(self, module: TrainModule) -> None:
        # One router per module: in-place engines (FSDP2) must not shard the same tree twice.
        router = (
            self._router
            if self._router is not None and self._router.module is module
            else _StepRouter(module)
        )
        self._router = router
        if self.sync_batchnorm:  # in place: BatchNorm children become SyncBatchNorm
            torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
        prepared = self.accelerator.prepare(router)
        self._wrapped_model = prepared
        if type(prepared) is _StepRouter:  # untouched by the engine: call the steps directly
            self._run_step: Callable[..., Any] = lambda name, *args: getattr(module, name)(*args)
            self._training_step = getattr(module, "training_step", None)
        else:
            self._run_step = prepared
            self._training_step = partial(prepared, "training_step")
        if profiling.is_profiling(self.profiler):
            self._run_step = profiling.profiled_steps(self.profiler, self._run_step)
            if self._training_step is not None:
                self._training_step = profiling.profiled(
                    self.profiler, "training_step", self._training_step
                )

    def _configure_optimizers(self, module: TrainModule) -> None:
        returned = module.configure_optimizers()
        where = f"{type(module).__name__}.configure_optimizers"
        if returned is None and module.automatic_optimization:
            raise HookResultError(
                f"configure_optimizers returned None under automatic optimization ({where}). "
                "Return an optimizer, e.g. torch.optim.AdamW(self.parameters(), lr=1e-3), or "
                "set automatic_optimization = False and step optimizers yourself."
            )
        optimizers, schedulers = (
            ([], []) if returned is None else parse_optimizer_config(returned, where)
        )
        if not module.automatic_optimization and (
            self.accumulate_grad_batches > 1 or self.gradient_clip_val is not None
        ):
            raise ConfigurationError(
                f"{type(module).__name__} uses manual optimization (automatic_optimization = False), "
                "so Trainer(accumulate_grad_batches=...) and Trainer(gradient_clip_val=...) cannot "
                "apply: step every N batches and call self.clip_gradients / "
                "torch.nn.utils.clip_grad_norm_ yourself in training_step."
            )
        if module.automatic_optimization and len(optimizers) > 1:
            raise HookResultError(
                f"configure_optimizers returned {len(optimizers)} optimizers under automatic "
                f"optimization ({where}). Return one, or set automatic_optimization = False and "
                "step them in training_step with self.optimizers()."
            )
        prepared = self.accelerator.prepare(*optimizers) if optimizers else []
        self.optimizers = (
            list(prepared) if isinstance(prepared, tuple) else [prepared] if optimizers else []
        )
        self.lr_scheduler_configs = schedulers

    def _prepare_loader(self, name: str, given: Any, *, required: bool) -> Any:
        loader = given if given is not None else self._find_loader(name)
        if loader is None:
            if required:
                raise ConfigurationError(
                    f"trainer: no {name} dataloader. Pass one to the call, return one from "
                    f"{name if name != 'validation' else 'val'}_dataloader(), or use a DataModule."
                )
            return None
        if not isinstance(loader, DataLoader):
            argument = {"train": "train_dataloaders", "validation": "val_dataloaders"}.get(
                name, "dataloaders"
            )
            raise ConfigurationError(
                f"trainer: {argument}={describe(loader)} is not a torch.utils.data.DataLoader. "
                "Wrap your dataset: DataLoader(dataset, batch_size=32)."
            )
        # use_distributed_sampler=False: the user's sampler already shards (Lightning's meaning).
        prepared = self.accelerator.prepare_data_loader(loader, shard=self.use_distributed_sampler)
        length = safe_len(prepared)
        warn_on_empty_loader(name, length)
        limit = resolve_limit(
            f"limit_{'val' if name == 'validation' else name}_batches",
            self.limit_batches[name],
            length,
        )
        prepared.limit = None if math.isinf(limit) else int(limit)
        count = limit if math.isinf(limit) else int(limit)
        if name == "train":
            self.num_training_batches = count
        else:
            setattr(self, f"num_{'val' if name == 'validation' else name}_batches", count)
        return prepared

    def _find_loader(self, name: str) -> Any:
        method = f"{'val' if name == 'validation' else name}_dataloader"
        for source in (self.datamodule, self.module):
            function = getattr(source, method, None)
            if function is not None:
                return function()
        return None

    def _teardown(self, stage: str, status: str, *, is_clean_exit: bool = False) -> None:
        if self.checkpoint_io is not None:  # return only once the save in flight is complete
            self.checkpoint_io.end_stage(self, stage, status)
        self.state.status = status
        if status == "finished":  # after an exception only on_exception runs (Lightning 2.6)
            if self.datamodule is not None:
                self.datamodule.teardown(stage)
            self._call_hook("teardown", stage)
        if self.is_global_zero:
            for logger in self.loggers:
                if stage == "fit":
                    logger.finalize("success" if status == "finished" else status)
                else:  # validate/test results are on disk when the call returns
                    logger.save()
        if not self._previous_deterministic:
            torch.use_deterministic_algorithms(False)
        if self.module is not None:
            self.module._metric_store = None
        # Drop the engine wrappers (DDP, ...): each run prepares the module afresh, and a wrapper
        # alive when the process group ends can abort the process.
        self._wrapped_model = self.module
        self._training_step = self._run_step = None  # type: ignore[assignment]
        self.accelerator.free_memory()
        self.strategy.teardown()
        # Every rank ends here together (a clean end, or the agreed stop of a preemption signal):
        # end the group now, not at interpreter exit. After a failure a barrier could hang.
        if (status == "finished" or is_clean_exit) and not self.strategy.should_keep_process_group:
            self.strategy.end_process_group()
        profiling.stop(self, stage)

    def _handle_exception(self, err: BaseException, stage: str) -> None:
        status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        self.state.status = status
        try:
            self._call_hook("on_exception", err)
        finally:
            self._teardown(
                stage, status, is_clean_exit=isinstance(err, SystemExit) and not err.code
            )

    # ---- the fit loop -------------------------------------------------------------------------
    def _run_sanity_check(self) -> None:
        if self.num_sanity_val_steps == 0 or not self._has_validation():
            return
        loader = self._loaders["validation"]
        full_limit = loader.limit
        steps = self.num_sanity_val_steps
        loader.limit = (
            None if steps < 0 else min(steps, full_limit if full_limit is not None else steps)
        )
        self.sanity_checking = True
        full_count, self.num_val_batches = self.num_val_batches, safe_len(loader)
        try:
            self._call_hook("on_sanity_check_start")
            self._eval_epoch("validation")
            self._call_hook("on_sanity_check_end")
        finally:
            self.sanity_checking = False
            loader.limit = full_limit
            self.num_val_batches = full_count
            self._stores["validation"].reset()  # sanity values are not real metrics

    def _is_preempted(self) -> bool:
        """Whether any process got SIGTERM/SIGUSR1 (all must agree to save together).

        Answered only where an optimizer step just completed, so an accumulation window is
        never split; with several processes, every ``_PREEMPTION_CHECK_EVERY`` steps.
        """
        if not self.accelerator.sync_gradients:
            return False
        seen = self._received_signal is not None
        if self.world_size == 1:
            return seen
        if self.progress.global_step % _PREEMPTION_CHECK_EVERY != 0:
            return False  # ranks agree at the same steps; a collective every step would cost
        flag = self.strategy.all_reduce(
            torch.tensor([float(seen)], device=self.strategy.root_device), op="max"
        )
        if flag.item() and not seen:
            self._received_signal = int(signal.SIGTERM)
        return bool(flag.item())

    def _is_done(self) -> bool:
        if self.should_stop or self.num_training_batches == 0:  # Lightning: "No training batches"
            return True
        if self.max_steps != -1 and self.progress.global_step >= self.max_steps:
            return True
        if self.max_epochs not in (None, -1) and self.progress.epoch >= self.max_epochs:
            return True
        return self._time_is_up()

    def _is_step_limit_reached(self) -> bool:
        """The per-batch part of ``_is_done`` (epochs cannot end mid-epoch): steps and time."""
        max_steps = self.max_steps
        if max_steps != -1 and self.progress.global_step >= max_steps:
            return True
        return self.max_time is not None and self._time_is_up()

    def _time_is_up(self) -> bool:
        return (
            self.max_time is not None
            and time.monotonic() - self._start_time >= self.max_time.total_seconds()
        )

    def _train_epoch(self) -> None:
        """One epoch of training, with validation where scheduled, then the epoch-end hooks."""
        loader = self._loaders["train"]
        store = self._stores["train"]
        store.start_epoch()
        loader.set_epoch(self.progress.epoch)
        loader.skip_batches = self.progress.batch_idx  # > 0 only when resuming mid-epoch
        if self._pending_rng_state is not None:  # resuming: continue the saved random streams
            set_rng_states(self._pending_rng_state)
            self._pending_rng_state = None
        self._wrapped_model.train()
        self._call_hook("on_train_epoch_start")
        val_every = self._val_check_batches()
        is_multi_process = self.world_size > 1
        is_epoch_complete = True
        first_batch_idx = self.progress.batch_idx
        batches = (
            profiling.profiled_batches(self.profiler, loader, loader=loader)
            if profiling.is_profiling(self.profiler)
            else loader
        )
        for batch_idx, batch in enumerate(batches, start=first_batch_idx):
            self.progress.batch_idx = batch_idx + 1
            if self._train_batch(batch, batch_idx) is _SKIP_EPOCH:
                break
            if (self._received_signal is not None or is_multi_process) and self._is_preempted():
                save_and_exit(self)
            is_last = loader.end_of_dataloader
            if (
                val_every
                and (batch_idx + 1) % val_every == 0
                and not is_last
                and self._should_validate_epoch()
            ):
                self._run_validation()
            if self.should_stop or self._is_step_limit_reached():
                is_epoch_complete = is_last
                break
        if first_batch_idx == 0 and self.progress.batch_idx == 0:  # nothing came: never would
            warn_on_empty_epoch(self.progress.epoch)
            self.should_stop = True
        is_validated = self.progress.last_val_step == self.progress.global_step  # e.g. on resume
        if (
            self._should_validate_epoch()
            and (is_epoch_complete or self.should_stop)
            and not is_validated
        ):
            self._run_validation()
        self._end_train_epoch(is_epoch_complete)

    def _end_train_epoch(self, is_complete: bool) -> None:
        """Epoch-end hooks and metrics; a stopped epoch keeps its position for resuming."""
        store = self._stores["train"]
        store.finalize_epoch()
        previous_hook = store.hook  # errors of self.log name the hook; its defaults are epoch's
        store.hook = ("on_train_epoch_end", False, True)
        try:
            self._call_hook("on_train_epoch_end")
        finally:
            store.hook = previous_hook
        epoch_metrics = store.finalize_epoch()
        for monitor in self._epoch_end_monitors:  # ModelCheckpoint, EarlyStopping: see the above
            monitor()
        # Lightning writes them at the step of the epoch's last row (optimizer steps - 1).
        self._send_to_loggers(store.epoch_items(for_logger=True) if epoch_metrics else {})
        if is_complete:
            if self.module.automatic_optimization:  # manual optimization steps its own
                self._step_schedulers("epoch")
            self.progress.epoch += 1
            self.progress.batch_idx = 0

    def _train_batch(self, batch: Any, batch_idx: int) -> Any:
        """One batch: step, backward, and on stepping batches the optimizer step."""
        self._stores["train"].current_batch = batch
        hooks = self._hooks
        if (
            hooks["on_train_batch_start"]
            and self._call_hook("on_train_batch_start", batch, batch_idx) == -1
        ):
            return _SKIP_EPOCH
        module = self.module
        is_stepping = False
        if not module.automatic_optimization:
            steps_before = sum(opt.step_count for opt in self.optimizers)
            with self.accelerator.autocast():
                output = self._training_step(batch, batch_idx)
            stepped = sum(opt.step_count for opt in self.optimizers) - steps_before
            self.progress.global_step += stepped
            if stepped and self.progress.global_step % self.log_every_n_steps < stepped:
                self._send_to_loggers(self._stores["train"].step_items(for_logger=True))
        else:
            with self.accelerator.accumulate(self._wrapped_model):
                with self.accelerator.autocast():
                    output = self._training_step(batch, batch_idx)
                loss = self._loss_of(output, batch_idx)
                # Lightning's order: gradients are cleared after the step of the window's first
                # batch, not after the optimizer step, so hooks and callbacks still see them.
                if batch_idx % self._accumulate_grad_batches == 0:
                    self._zero_grad()
                if loss is not None:
                    self._backward(loss)
                is_stepping = self.accelerator.sync_gradients
                if is_stepping:
                    self._optimizer_step(is_skipped=loss is None)
        if self.checkpoint_io is not None:  # a background save that ended: finish it or raise
            self.checkpoint_io.poll()
        if self._hooks["on_train_batch_end"]:  # hot path: build nothing nobody reads
            output = {"loss": output.detach()} if isinstance(output, torch.Tensor) else output
            self._call_hook("on_train_batch_end", output, batch, batch_idx)
        # Lightning writes the step row after on_train_batch_end (what it logs joins the row),
        # and also for the batch that stops the fit.
        if self._is_step_row_due or (is_stepping and self.should_stop):
            self._send_step_row()
        return output

    def _send_step_row(self) -> None:
        """Write the training step row (after ``on_train_batch_end``, or before a checkpoint)."""
        self._is_step_row_due = False
        self._send_to_loggers(self._stores["train"].step_items(for_logger=True))

    def _backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        hooks = self._hooks  # empty hook lists are skipped without a call: this runs every batch
        if hooks["on_before_backward"]:
            self._call_hook("on_before_backward", loss)
        if self.detect_anomaly:
            self._anomaly_backward(loss, **kwargs)
        else:
            self.accelerator.backward(loss, **kwargs)
        if hooks["on_after_backward"]:
            self._call_hook("on_after_backward")

    def _manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``TrainModule.manual_backward``: the same hooks and path as automatic backward."""
        if self.detect_anomaly:
            self._check_finite(loss, "training_step (manual_backward)")
        self._backward(loss, **kwargs)

    def _zero_grad(self) -> None:
        """``on_before_zero_grad``, then clear the gradients (first batch of each window)."""
        optimizer = self.optimizers[0]
        if self._hooks["on_before_zero_grad"]:
            self._call_hook("on_before_zero_grad", optimizer)
        # The wrapped optimizer's own zero_grad: the prepared one's is a no-op inside a window.
        optimizer.optimizer.zero_grad()

    def _optimizer_step(self, *, is_skipped: bool = False) -> None:
        """Unscale, hook, clip, step; count the step and step 'step' schedulers.

        ``is_skipped`` (training_step returned None): as in Lightning, the hook runs and the
        step is counted, but the optimizer does not step.
        """
        optimizer = self.optimizers[0]
        if self._hooks["on_before_optimizer_step"]:
            if not is_skipped:
                self.accelerator.unscale_gradients()  # hooks see true gradients
            self._call_hook("on_before_optimizer_step", optimizer)
        if not is_skipped:
            if self.gradient_clip_val is not None:
                parameters = self.module.parameters()
                if self.gradient_clip_algorithm == "norm":
                    self.accelerator.clip_grad_norm_(parameters, self.gradient_clip_val)
                else:
                    self.accelerator.clip_grad_value_(parameters, self.gradient_clip_val)
            optimizer.step()
        self.progress.global_step += 1
        if self.lr_scheduler_configs and not self.accelerator.optimizer_step_was_skipped:
            self._step_schedulers("step")
        if self.progress.global_step % self.log_every_n_steps == 0:
            self._is_step_row_due = True  # written after on_train_batch_end (`_train_batch`)

    def _loss_of(self, output: Any, batch_idx: int) -> torch.Tensor | None:
        """Check ``training_step``'s result and return the loss (None skips the batch)."""
        if isinstance(output, torch.Tensor):
            loss = output
        elif output is None:
            return None
        elif isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
            loss = output["loss"]
        else:
            detail = " without a 'loss' Tensor" if isinstance(output, dict) else ""
            raise HookResultError(
                f"training_step returned {type(output).__name__}{detail}; expected a Tensor, a "
                f'dict with "loss", or None ({self._where("training_step", batch_idx)}). Return '
                "the loss tensor."
            )
        if loss.numel() != 1 or not loss.requires_grad:
            problem = (
                f"of shape {tuple(loss.shape)}"
                if loss.numel() != 1
                else "that does not require grad"
            )
            raise HookResultError(
                f"training_step returned a loss {problem} ({self._where('training_step', batch_idx)}). "
                "Return one scalar computed from the model's outputs, outside torch.no_grad() "
                "and without .detach()."
            )
        if self.detect_anomaly:
            self._check_finite(loss, self._where("training_step", batch_idx))
        return loss

    def _check_finite(self, loss: torch.Tensor, where: str) -> None:
        if not torch.isfinite(loss).all():
            kind = "nan" if torch.isnan(loss).any() else "inf"
            raise AnomalyError(
                f"detect_anomaly: the loss is {kind} ({where}). Check the inputs, lower the "
                "learning rate, or clip gradients (gradient_clip_val)."
            )

    def _anomaly_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                self.accelerator.backward(loss, **kwargs)
        except RuntimeError as err:
            if "nan" not in str(err).lower():
                raise
            raise AnomalyError(
                f"detect_anomaly: backward produced nan gradients (after training_step, "
                f"{self._where('training_step', self.progress.batch_idx - 1)}): {err}"
            ) from err
        bad = [
            name
            for name, p in self.module.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        if bad:
            raise AnomalyError(
                f"detect_anomaly: nan/inf gradients in {bad[:5]} after backward of training_step "
                f"({self._where('training_step', self.progress.batch_idx - 1)})."
            )

    def _where(self, hook: str, batch_idx: int) -> str:
        return (
            f"{type(self.module).__name__}.{hook}, epoch {self.progress.epoch}, batch {batch_idx}"
        )

    def _step_schedulers(self, interval: str) -> None:
        count = self.progress.global_step if interval == "step" else self.progress.epoch + 1
        step_schedulers(self.lr_scheduler_configs, interval, count, lambda: self.callback_metrics)

    # ---- validation / test / predict ----------------------------------------------------------
    def _has_validation(self) -> bool:
        return self._loaders.get("validation") is not None and overrides(
            self.module, "validation_step"
        )

    def _val_check_batches(self) -> int:
        """Run validation every this many train batches inside the epoch (0: only at the end)."""
        if not self._has_validation():
            return 0
        interval = self.val_check_interval
        if isinstance(interval, int):
            if interval > self.num_training_batches:
                raise ConfigurationError(
                    f"Trainer(val_check_interval={interval}) is more than the "
                    f"{self.num_training_batches} training batches per epoch. Use a smaller int, or a "
                    "float fraction of the epoch."
                )
            return interval
        if interval >= 1.0 or math.isinf(self.num_training_batches):
            return 0
        return max(1, int(self.num_training_batches * interval))

    def _should_validate_epoch(self) -> bool:
        if not self._has_validation() or self.num_val_batches == 0:
            return False
        every = self.check_val_every_n_epoch
        return every is None or (self.progress.epoch + 1) % every == 0

    def _run_validation(self) -> None:
        was_training = self._wrapped_model.training
        self.progress.last_val_step = self.progress.global_step
        self._eval_epoch("validation")
        self._wrapped_model.train(was_training)

    def _eval_epoch(self, stage: str) -> Any:
        """One epoch of ``stage`` ("validation", "test", "predict"): hooks, steps, metrics."""
        loader = self._loaders.get(stage)
        step_name = _STEP_NAMES[stage]
        if loader is None or not overrides(self.module, step_name):
            if stage != "validation":
                raise ConfigurationError(
                    f"trainer.{_STAGE_OF[stage]}: {type(self.module).__name__} has no {step_name}. "
                    f"Implement {step_name}(self, batch, batch_idx)."
                )
            return {}
        store = self._stores.get(stage)
        if store is not None:
            store.start_epoch()
            store.hook = (step_name, False, True)
            self.module._metric_store = store
        is_logging = store is not None and not self.sanity_checking
        self._wrapped_model.eval()
        predictions: list[Any] = []
        self._call_hook(f"on_{stage}_start")
        self._call_hook(f"on_{stage}_epoch_start")
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader):
                if store is not None:
                    store.current_batch = batch
                self._call_hook(f"on_{stage}_batch_start", batch, batch_idx)
                with self.accelerator.autocast():
                    output = self._run_step(step_name, batch, batch_idx)
                if stage == "predict":
                    predictions.append(output)
                self._call_hook(f"on_{stage}_batch_end", output, batch, batch_idx)
                if is_logging:
                    self._send_eval_step(store)
        if store is None:
            self._call_hook(f"on_{stage}_epoch_end")
        else:
            store.hook = (f"on_{stage}_epoch_end", False, True)  # errors of self.log name it
            try:
                self._call_hook(f"on_{stage}_epoch_end")
            finally:
                store.hook = (step_name, False, True)
            store.finalize_epoch()
        if is_logging:
            self._send_to_loggers(store.epoch_items(for_logger=True), self._eval_log_step())
        self._call_hook(f"on_{stage}_end")
        self.module._metric_store = self._stores["train"]
        if stage == "predict":
            return predictions
        # Lightning's validate()/test() results: the logged epoch values, by published name.
        return store.epoch_items(for_logger=True) if store is not None else {}

    def _send_eval_step(self, store: MetricStore) -> None:
        """Lightning's validation/test step rows: ``on_step`` values (``name_step``) at the
        count of batches of this stage so far in the run, with no ``epoch``."""
        items = store.step_items(for_logger=True)
        if items:
            self._send_to_loggers(items, store.batch_count, has_epoch=False)
        store.batch_count += 1

    def _eval_log_step(self) -> int:
        """Lightning's step for validation/test epoch rows: within fit, the optimizer steps
        taken before the current batch's (the step of its training row); otherwise all."""
        step = self.progress.global_step
        if self.state.stage == "fit" and self.accelerator.sync_gradients:
            step -= 1  # this batch stepped: its row is at global_step - 1
        return step

    # ---- logging -----------------------------------------------------------------------------
    def _send_to_loggers(
        self, items: dict[str, Any], step: int | None = None, *, has_epoch: bool = True
    ) -> None:
        """Read the values (the one host sync) and write them to every logger on rank zero.

        ``step`` defaults to Lightning's training step: the optimizer steps done before the
        current batch's, ``global_step - 1`` once it has stepped (every ``log_every_n_steps``:
        steps n-1, 2n-1, ...; epoch-end rows share the step of the epoch's last batch, -1
        when no optimizer step was taken yet, as in Lightning). Rows carry ``epoch`` unless
        ``has_epoch`` is False (Lightning's validation/test step rows).
        """
        if not items or not self.loggers or not self.is_global_zero:
            return
        if step is None:
            step = self.progress.global_step - 1
        metrics = {name: to_float(value) for name, value in items.items()}
        if has_epoch:
            metrics.setdefault("epoch", float(self.progress.epoch))
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    def _log_hyperparams(self) -> None:
        params = dict(self.module.hparams)
        if self.datamodule is not None:
            params.update(self.datamodule.hparams)
        if params and self.is_global_zero:
            for logger in self.loggers:
                logger.log_hyperparams(params)

    def _check_same_metric_keys(self, names: list[str]) -> None:
        """Fail clearly, before any collective, when processes logged different synced names."""
        if self.world_size == 1:
            return
        everyone = self.strategy.all_gather_object(names)
        if any(other != names for other in everyone):
            detail = "; ".join(f"rank {rank}: {keys}" for rank, keys in enumerate(everyone))
            raise ConfigurationError(
                f"self.log(..., sync_dist=True): the processes logged different metric names ({detail}). "
                "Log the same names on every rank (log a default value where a rank has none)."
            )

    def _reduce_for_logging(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        return self.strategy.all_reduce(tensor, op=op)

    # ---- hooks -------------------------------------------------------------------------------
    def _build_hook_table(self, module: TrainModule) -> dict[str, list[Callable[..., Any]]]:
        """For each hook, the implementations to call, in Lightning 2.6's order (`trainer.trainer.hooks`).

        Callbacks in list order, then the module; ``on_load_checkpoint`` module first; in
        ``on_train_epoch_end`` the monitoring callbacks after the module. Only overridden hooks
        (on the class, or assigned on the instance) are listed, so empty lists cost nothing.
        """
        table: dict[str, list[Callable[..., Any]]] = {}
        self._module_hook_functions = {}
        for name in CALLBACK_HOOKS:
            own: list[Callable[..., Any]] = []
            if name not in CALLBACK_ONLY_HOOKS and _is_overridden(module, name, ModuleHooks):
                own.append(self._timed_hook(getattr(module, name), module, name, "TrainModule"))
                self._module_hook_functions[name] = own[0]
            before: list[Callable[..., Any]] = []
            after: list[Callable[..., Any]] = []
            for callback in self.callbacks:
                if not _is_overridden(callback, name, Callback):
                    continue
                function = self._timed_hook(
                    partial(getattr(callback, name), self, module), callback, name, "Callback"
                )
                is_monitor = name == "on_train_epoch_end" and any(
                    is_instance_named(callback, monitor) for monitor in MONITORING_CALLBACKS
                )
                (after if is_monitor else before).append(function)
            if name == "on_load_checkpoint":
                table[name] = [*own, *before]
            else:
                table[name] = [*before, *own]
            if name == "on_train_epoch_end":
                self._epoch_end_monitors = after  # called once the module's metrics are in
        return table

    def _timed_hook(
        self, function: Callable[..., Any], owner: object, name: str, kind: str
    ) -> Callable[..., Any]:
        """``function`` as is, or timed as ``[kind]Class.hook`` when a profiler is in use."""
        if not profiling.is_profiling(self.profiler):
            return function
        action = f"[{kind}]{type(owner).__name__}.{name}"
        return profiling.profiled(self.profiler, action, function)

    def _call_hook(self, name: str, *args: Any) -> Any:
        """Run hook ``name`` on the callbacks and the module, in the order of `_build_hook_table`.

        Returns the module's result (``on_train_batch_start`` may return -1 to end the epoch).
        """
        functions = self._hooks.get(name)
        if functions is None:
            raise ConfigurationError(
                f"internal: {name!r} is not a hook; see trainer.trainer.hooks.CALLBACK_HOOKS"
            )
        module_function = self._module_hook_functions.get(name)
        result = None
        for function in functions:
            returned = function(*args)
            if function is module_function:
                result = returned
        return result


def _is_overridden(obj: object, name: str, base: type) -> bool:
    """Whether ``obj`` implements hook ``name``: on its class, or assigned on the instance."""
    return name in vars(obj) or getattr(type(obj), name, None) is not getattr(base, name)


_SKIP_EPOCH = object()
_PREEMPTION_CHECK_EVERY = 10  # optimizer steps between the ranks' agreement on a signal
