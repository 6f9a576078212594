"""The Trainer: sets up and tears down each call (fit / validate / test / predict).

The loops live next door and read top to bottom: `trainer.trainer.fit_loop` (epochs, batches,
optimizer steps, validation inside fit) and `trainer.trainer.evaluation_loop` (one epoch of
validation / test / predict), handed a `Run` by ``_setup``. Device, precision and processes go
through ``self.accelerator``; callbacks and loggers see only public attributes; hooks run
through one `HookTable` in DESIGN §3's order.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from trainer.callbacks.callback import Callback, TunerExit
from trainer.errors import ConfigurationError
from trainer.loggers.logger import Logger
from trainer.plugins.async_checkpoint import PendingSave, find_checkpoint_io
from trainer.precision import Precision
from trainer.profilers import Profiler, resolve_profiler
from trainer.strategies import Strategy
from trainer.trainer import checkpoint_state, profiling
from trainer.trainer.defaults import check_log_interval, default_switches
from trainer.trainer.evaluation_loop import STAGE_OF, run_eval_epoch
from trainer.trainer.fit_loop import FitLoop, run_sanity_check
from trainer.trainer.hook_table import HookTable
from trainer.trainer.loaders import end_workers, load_stage, prepare_data, reset_train_loader
from trainer.trainer.log_refusal import refusing_logs
from trainer.trainer.logger_rows import log_hyperparams
from trainer.trainer.metrics import stage_stores
from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.module_callbacks import build_callbacks, with_module_callbacks
from trainer.trainer.module_hooks import warn_on_lightning_hooks
from trainer.trainer.optimizer_config import SchedulerConfig
from trainer.trainer.options import (
    apply_benchmark,
    build_loggers,
    check_accumulation,
    check_bool,
    check_call_arguments,
    check_clip,
    check_fast_dev_run,
    check_max_steps,
    check_min_limits,
    check_overfit_batches,
    check_positive_int,
    check_sanity_steps,
    check_sync_batchnorm,
    check_val_interval,
    datamodule_argument,
    default_max_epochs,
    module_argument,
    parse_max_time,
    resolve_plugins,
    resolve_root_dir,
)
from trainer.trainer.preemption import act_on_late_signal, catch_preemption_signals
from trainer.trainer.prepare import (
    StepRouter,
    build_accelerator,
    configure_optimizers,
    prepare_steps,
)
from trainer.trainer.properties import TrainerProperties
from trainer.trainer.results_table import eval_results
from trainer.trainer.run import Progress, Run, TrainerState

__all__ = ["Progress", "Trainer", "TrainerState"]

# An evaluation stage's data: one DataLoader, or several (one dataloader_idx each, in order).
EvalData = DataLoader | Sequence[DataLoader] | Mapping[str, DataLoader] | None


class Trainer(TrainerProperties):
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
        gradient_clip_algorithm: str | None = "norm",
        val_check_interval: int | float | str | dt.timedelta | dict[str, int] | None = 1.0,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = 2,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        log_every_n_steps: int | None = 50,
        enable_progress_bar: bool | None = True,
        enable_checkpointing: bool | None = True,
        enable_model_summary: bool | None = True,
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
        min_epochs: int | None = None,
        min_steps: int | None = None,
        overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0,
        inference_mode: bool = True,
        enable_autolog_hparams: bool = True,
    ) -> None:
        switches = (enable_progress_bar, enable_model_summary, enable_checkpointing)
        logger, *switches = default_switches(barebones, profiler, logger, *switches)
        enable_progress_bar, enable_model_summary, enable_checkpointing = switches
        self.barebones = barebones
        self.default_root_dir = resolve_root_dir(default_root_dir)
        self.fast_dev_run = check_fast_dev_run(fast_dev_run)
        dev_batches = self.fast_dev_run or None
        max_steps = check_max_steps(max_steps)
        max_epochs = default_max_epochs(max_epochs, max_steps)
        self.max_epochs = 1 if dev_batches else max_epochs
        self.max_steps = dev_batches or max_steps
        self.min_epochs, self.min_steps = check_min_limits(min_epochs, min_steps)
        self.max_time = parse_max_time(max_time)
        accumulate_grad_batches = check_accumulation(accumulate_grad_batches)  # 2.0 (YAML): 2
        self._accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = check_clip(gradient_clip_val, gradient_clip_algorithm)
        if check_val_every_n_epoch is not None:
            check_positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
        self.check_val_every_n_epoch = 1 if dev_batches else check_val_every_n_epoch
        self.val_check_interval = (
            1.0 if dev_batches else check_val_interval(val_check_interval, check_val_every_n_epoch)
        )
        self.num_sanity_val_steps = 0 if dev_batches else check_sanity_steps(num_sanity_val_steps)
        self.overfit_batches = check_overfit_batches(overfit_batches)
        overfit = self.overfit_batches or None  # Lightning: it replaces both limits
        self.limit_batches = {
            "train": overfit or dev_batches or limit_train_batches,
            "validation": overfit or dev_batches or limit_val_batches,
            "test": dev_batches or limit_test_batches,
            "predict": dev_batches or limit_predict_batches,
        }
        self.log_every_n_steps = 1 if dev_batches else check_log_interval(log_every_n_steps)
        self.reload_dataloaders_every_n_epochs = check_positive_int(
            "reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs, allow_zero=True
        )
        self.inference_mode = check_bool("inference_mode", inference_mode)
        self.enable_autolog_hparams = check_bool("enable_autolog_hparams", enable_autolog_hparams)
        self.deterministic = deterministic
        self.detect_anomaly = detect_anomaly
        self.use_distributed_sampler = use_distributed_sampler
        self.compile = compile
        self.seed = seed
        self.num_nodes = check_positive_int("num_nodes", num_nodes)
        precision_plugin, environment = resolve_plugins(plugins)
        self.sync_batchnorm = check_sync_batchnorm(sync_batchnorm, accelerator, devices)
        self.accelerator = build_accelerator(
            strategy, accelerator, devices, precision_plugin or precision, accumulate_grad_batches
        )
        if environment is not None and hasattr(self.strategy, "environment"):
            self.strategy.environment = environment
        apply_benchmark(benchmark, deterministic)
        self.profiler = resolve_profiler(profiler)
        self.checkpoint_io = find_checkpoint_io(plugins)  # AsyncCheckpointIO, or None: synchronous
        self.loggers = build_loggers(logger, self.default_root_dir, fast_dev_run=bool(dev_batches))
        self.enable_checkpointing = enable_checkpointing and not dev_batches
        switches = (enable_progress_bar, enable_model_summary, self.enable_checkpointing)
        # enable_checkpointing as given too: a checkpoint callback with False is refused
        self.callbacks = build_callbacks(callbacks, *switches, enable_checkpointing, self.max_time)
        self.progress = Progress()
        self.state = TrainerState()
        self.should_stop = self.sanity_checking = False
        self.module: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[Any] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self.num_training_batches: float = 0
        self.num_val_batches = self.num_test_batches = self.num_predict_batches = 0
        self._stores = stage_stores(self.strategy)  # kept across calls: callback_metrics read them
        self._hooks: HookTable | None = None
        self._loaders: dict[str, Any] = {}
        self._run: Run | None = None  # what the current call set up, handed to the loops
        self._fit_loop: FitLoop | None = None
        self._previous_deterministic = torch.are_deterministic_algorithms_enabled()
        self._router: StepRouter | None = None
        self._wrapped_model: torch.nn.Module | None = None
        self._given_stages: frozenset[str] = frozenset()  # loaders given to the call: never rebuilt
        self._pending_rng_state: dict[str, Any] | None = None  # applied when training resumes
        self._restored_metrics: dict[str, float] = {}  # callback_metrics of a resumed checkpoint
        self._callback_metrics: dict[str, torch.Tensor] = {}  # the dict callback_metrics returns

    def reset_train_dataloader(self) -> None:
        """Rebuild the train dataloader from the DataModule/TrainModule and prepare it again
        (BatchSizeFinder, at ``on_fit_start``): same shuffle seed and epoch, global RNG untouched.

        Raises: ConfigurationError: fit received the DataLoader directly (nothing to rebuild).
        """
        reset_train_loader(self, self._loaders, self._given_stages)

    # ---- entry points -------------------------------------------------------------------------
    def fit(
        self,
        module: TrainModule | None = None,
        train_dataloaders: EvalData = None,
        val_dataloaders: EvalData = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | None = None,
        *,
        model: TrainModule | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``module``; validate along the way when it has ``validation_step``.

        Data: the arguments, else ``datamodule``, else the module's ``*_dataloader`` methods;
        several train loaders (dict, list, `CombinedLoader`) are read together, as Lightning's.
        ``ckpt_path`` ("last", "best" or a path) resumes exactly where training stopped;
        ``model=`` names the module; ``weights_only`` is accepted (nothing is unpickled)."""
        module = module_argument(module, model, "fit")
        train_dataloaders, datamodule = datamodule_argument(train_dataloaders, datamodule, "fit")
        self._attach(module, datamodule, "fit")
        try:
            with catch_preemption_signals() as received_signal:
                loaders = {"train": train_dataloaders, "validation": val_dataloaders}
                self._setup("fit", loaders, ckpt_path)
                run_sanity_check(self, self._run)
                self._fit_loop = FitLoop(self, self._run, received_signal, self._pending_rng_state)
                self._pending_rng_state = None
                profiling.profile_fit_loop(self.profiler, self._fit_loop)
                trained = self._fit_loop.run()  # False: nothing to train (Lightning's skip)
                if trained:
                    self._call_hook("on_train_end")
                self._call_hook("on_fit_end")
                act_on_late_signal(self, received_signal, "fit")  # one in on_*_end: save, exit
        except TunerExit:  # a Tuner's search ended the fit at on_fit_start, as Lightning's does
            pass
        except BaseException as err:
            self._handle_exception(err, "fit")
            raise
        self._teardown("fit", "finished")

    def validate(
        self,
        module: TrainModule | None = None,
        dataloaders: EvalData = None,
        ckpt_path: str | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        *,
        model: TrainModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run one validation epoch; return ``[{metric: value}]``, one dict per dataloader
        (with ``verbose``, also printed as Lightning's table on global rank zero)."""
        module = module_argument(module, model, "validate")
        return self._run_eval("validation", module, dataloaders, ckpt_path, datamodule, verbose)

    def test(
        self,
        module: TrainModule | None = None,
        dataloaders: EvalData = None,
        ckpt_path: str | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        *,
        model: TrainModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run one test epoch; return ``[{metric: value}]``, one dict per dataloader
        (with ``verbose``, also printed as Lightning's table on global rank zero)."""
        module = module_argument(module, model, "test")
        return self._run_eval("test", module, dataloaders, ckpt_path, datamodule, verbose)

    def predict(
        self,
        module: TrainModule | None = None,
        dataloaders: EvalData = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
        *,
        model: TrainModule | None = None,
        return_predictions: bool | None = None,
        weights_only: bool | None = None,
    ) -> list[Any] | None:
        """Run ``predict_step`` over the data; return its outputs, one per batch (a list of such
        lists with several dataloaders); ``return_predictions=False``: keep none, return None."""
        module = module_argument(module, model, "predict")
        keep = return_predictions is not False
        return self._run_eval("predict", module, dataloaders, ckpt_path, datamodule, keep=keep)

    def _run_eval(
        self,
        stage: str,
        module: TrainModule | None,
        dataloaders: Any,
        ckpt_path: str | None,
        datamodule: DataModule | None,
        verbose: bool = False,
        keep: bool = True,
    ) -> Any:
        run_stage = STAGE_OF[stage]
        dataloaders, datamodule = datamodule_argument(dataloaders, datamodule, run_stage)
        ckpt_path = checkpoint_state.default_eval_ckpt_path(self, module, ckpt_path, run_stage)
        module = module if module is not None else self.module
        if module is None:
            raise ConfigurationError(
                f"trainer.{run_stage}(): no module given and none was fitted before. Pass the "
                f"module: trainer.{run_stage}(module, dataloaders)."
            )
        self._attach(module, datamodule, run_stage)
        try:
            with catch_preemption_signals(run_stage) as received_signal:
                self._setup(run_stage, {stage: dataloaders}, ckpt_path)
                self._run.keep_predictions = keep
                result = run_eval_epoch(self, self._run, stage)
                if stage != "predict":  # floats; Lightning's table printed on rank zero
                    result = eval_results(result, run_stage, verbose and self.is_global_zero)
                act_on_late_signal(self, received_signal, run_stage)  # the results first
        except BaseException as err:
            self._handle_exception(err, run_stage)
            raise
        self._teardown(run_stage, "finished")
        if stage == "predict":  # one list of outputs per dataloader; Lightning unwraps one
            return None if not keep or result is None else result[0] if len(result) == 1 else result
        return result

    def save_checkpoint(
        self, filepath: str | os.PathLike[str], weights_only: bool = False
    ) -> PendingSave | None:
        """Write a checkpoint directory at ``filepath`` (atomically; see docs/checkpointing.md).

        Returns:
            None when written; with ``plugins=[AsyncCheckpointIO()]`` during ``fit``, the
            `trainer.plugins.PendingSave` being written in the background.

        Raises:
            ConfigurationError: no module is attached yet; CheckpointError: the write failed.
        """
        return checkpoint_state.save_checkpoint(
            self, self._hooks, filepath, weights_only=weights_only
        )

    # ---- setup and teardown -----------------------------------------------------------------
    def _attach(self, module: TrainModule, datamodule: DataModule | None, stage: str) -> None:
        check_call_arguments(module, datamodule, stage)
        self.module, self.datamodule = module, datamodule
        module.trainer = self
        if datamodule is not None:
            datamodule.trainer = self
        self.state = TrainerState(stage, "running", "train" if stage == "fit" else stage)
        self.should_stop = self.should_stop and stage != "fit"  # Lightning: set until a fit
        self.callbacks = with_module_callbacks(self.callbacks, module)  # configure_callbacks
        self._hooks = HookTable(self, module, self.callbacks, self.profiler)

    def _setup(self, stage: str, loaders: dict[str, Any], ckpt_path: Any = None) -> None:
        """Seed, set up data, hooks, model, optimizers, dataloaders; restore ``ckpt_path``."""
        profiling.start(self, stage)
        module = self.module
        if self.seed is not None:
            from trainer.runtime.seed import seed_everything

            seed_everything(self.seed)
        self._previous_deterministic = torch.are_deterministic_algorithms_enabled()
        if self.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        prepare_data(self)  # once per machine, then a barrier (Lightning's)
        if self.datamodule is not None:
            self.datamodule.setup(stage)
        for store in self._stores.values():  # metrics of an earlier run are not this run's
            store.reset()
        self._callback_metrics.clear()
        self._restored_metrics = {}
        warn_on_lightning_hooks(module)
        self._call_hook("setup", stage)
        with self.strategy.module_init_context():
            refusing_logs(module.configure_model, module, "configure_model")()
        if self.compile:
            options = self.compile if isinstance(self.compile, dict) else {}
            module.compile(**options)
        steps = prepare_steps(self, module, self._router)
        self._router, self._wrapped_model = steps.router, steps.model
        opened = checkpoint_state.open_checkpoint(self, ckpt_path, stage)
        self._loaders = {}
        self._given_stages = frozenset(name for name, given in loaders.items() if given is not None)
        for name, given in loaders.items():  # before optimizers: schedulers may need the length
            required = name in ("train", "test", "predict")
            self._loaders[name] = load_stage(self, name, given, required=required)
        if stage == "fit":
            configure = refusing_logs(configure_optimizers, module, "configure_optimizers")
            self.optimizers, self.lr_scheduler_configs = configure(self, module)
        module.metric_store = self._stores["train"]
        self._run = Run(
            hooks=self._hooks,
            loaders=self._loaders,
            given_stages=self._given_stages,
            stores=self._stores,
            model=steps.model,
            run_step=steps.run_step,
            training_step=steps.training_step,
            callback_metrics=self._callback_metrics,
        )
        resumed = checkpoint_state.restore_from(self, opened, stage, self._hooks)
        self._run.is_resumed = resumed is not None
        if resumed is not None:
            self._restored_metrics = resumed.callback_metrics
            self._pending_rng_state = resumed.rng_state
        profiling.expect_steps(self, stage)
        if stage == "fit":
            self._call_hook("on_fit_start")
        if self.enable_autolog_hparams:  # Lightning: every stage, after on_fit_start
            log_hyperparams(self)

    def _teardown(self, stage: str, status: str, *, is_clean_exit: bool = False) -> None:
        if self.checkpoint_io is not None:  # return only once the save in flight is complete
            fail = functools.partial(self._handle_exception, stage=stage)
            self.checkpoint_io.end_stage(status, fail_stage=fail)
        self.state.status = status
        if status == "finished":  # after an exception only on_exception runs (Lightning 2.6)
            try:
                if self.datamodule is not None:
                    self.datamodule.teardown(stage)
                self._call_hook("teardown", stage)
            except BaseException as err:  # on_exception, the rest torn down as failed
                self._handle_exception(err, stage)
                raise
        if self.is_global_zero:
            for logger in self.loggers:
                if stage == "fit":
                    logger.finalize("success" if status == "finished" else status)
                else:  # validate/test results are on disk when the call returns
                    logger.save()
        if not self._previous_deterministic:
            torch.use_deterministic_algorithms(False)
        if self.module is not None:
            self.module.metric_store = None
        # Drop the engine wrappers (DDP, ...): each run prepares the module afresh, and a wrapper
        # alive when the process group ends can abort the process.
        self._wrapped_model = self.module
        self._run = self._fit_loop = None
        end_workers(self._loaders.values())
        self.accelerator.free_memory(collect_garbage=False)  # gc.collect: ~0.1 s per run
        self.strategy.teardown()
        # Every rank ends here together (a clean end, or the agreed stop of a preemption signal):
        # end the group now, not at interpreter exit. After a failure a barrier could hang.
        if (status == "finished" or is_clean_exit) and not self.strategy.should_keep_process_group:
            self.strategy.end_process_group()
        profiling.stop(self, stage)
        self.state.running = None  # trainer.training & co. are False between calls

    def _handle_exception(self, err: BaseException, stage: str) -> None:
        # Ctrl-C, or an exit with status 0 (a preemption's, after its checkpoint): interrupted
        is_clean_exit = isinstance(err, SystemExit) and not err.code
        status = "interrupted" if isinstance(err, KeyboardInterrupt) or is_clean_exit else "failed"
        self.state.status = status
        try:
            self._call_hook("on_exception", err)
            if self.datamodule is not None:  # after the callbacks', as Lightning
                self.datamodule.on_exception(err)
        finally:
            self._teardown(stage, status, is_clean_exit=is_clean_exit)

    # ---- hooks; TrainModule.manual_backward ---------------------------------------------------
    def _call_hook(self, name: str, *args: Any) -> Any:
        """Run hook ``name`` in DESIGN §3's order (see `HookTable.call`)."""
        return self._hooks.call(name, *args)

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """What ``TrainModule.manual_backward`` calls: the fit loop's backward, with its hooks.

        Raises:
            ConfigurationError: called outside ``fit``.
        """
        if self._fit_loop is None:
            raise ConfigurationError("manual_backward: called outside fit (use training_step).")
        self._fit_loop.manual_backward(loss, **kwargs)
