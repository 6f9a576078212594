"""The Accelerator: the one path every model, optimizer, dataloader, loss and tensor takes.

It is a facade with Hugging Face Accelerate's public verbs. It checks arguments and delegates:
devices, processes and collectives to the Strategy, number formats to the Precision plugin,
dataloaders to ``trainer/data``, trackers to ``trainer/loggers``. It never branches on the engine.
Unlike Accelerate, each Accelerator honours its own arguments; only ``PartialState`` is shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from trainer.accelerator.checkpoint_api import CheckpointAPI
from trainer.accelerator.engine_setup import setup_engine
from trainer.accelerator.handler_setup import autocast_context, profile_session
from trainer.accelerator.memory import empty_device_cache
from trainer.accelerator.model_wrappers import AutocastForward
from trainer.accelerator.optimizer import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    parameter_replacements,
    place_state_with_parameters,
    use_replaced_parameters,
    warn_on_eps_below_dtype,
)
from trainer.accelerator.parallelism_api import ParallelismAPI
from trainer.accelerator.process_api import ProcessAPI
from trainer.accelerator.tracker_api import TrackerAPI
from trainer.data.loader import DataLoaderShard, skip_first_batches
from trainer.data.prepare import prepare_loader_shard
from trainer.errors import ConfigurationError
from trainer.loggers.registry import check_log_with
from trainer.precision import Precision
from trainer.runtime.configs import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from trainer.runtime.gradient_state import GradientState
from trainer.runtime.kwargs_handlers import AutocastKwargs, ProfileKwargs
from trainer.runtime.launcher_watch import watch_launcher
from trainer.runtime.state import AcceleratorState
from trainer.strategies import Strategy

if TYPE_CHECKING:
    from trainer.accelerator.parallelism import ParallelismConfig
    from trainer.plugins import AsyncCheckpointIO
    from trainer.runtime import engine_plugins as plugins

__all__ = ["Accelerator"]

_NOTHING = contextlib.nullcontext()  # reusable: entering it has no state
_BACKWARD, _PLAIN_BACKWARD = Strategy.backward, Precision.backward  # the base ones

_SCHEDULER_TYPES: tuple[type, ...] = (
    torch.optim.lr_scheduler.LRScheduler,
    torch.optim.lr_scheduler.ReduceLROnPlateau,
)


class Accelerator(ProcessAPI, ParallelismAPI, CheckpointAPI, TrackerAPI):
    """Runs a hand-written training loop on any strategy and precision.

    Args:
        mixed_precision: "no", "fp16", "bf16", "fp8", any Trainer precision name
            ("bf16-mixed", "16-true", ...) or a Precision plugin. None reads
            ``ACCELERATE_MIXED_PRECISION`` (set by ``trainer launch``), else "no".
        gradient_accumulation_steps: batches per optimizer step inside ``accumulate``.
        cpu: force the CPU even when an accelerator is present.
        strategy: a Strategy instance or a registered name; None picks single-device.
        split_batches: shorthand for ``DataLoaderConfiguration(split_batches=...)``.
        dataloader_config: how dataloaders are sharded (DataLoaderConfiguration).
        project_dir: where checkpoints and tracker files go (shorthand for ``project_config``).
        project_config: the full ``ProjectConfiguration``.
        log_with: tracker names (``LoggerType`` or str), Logger instances, or a list of them.
        gradient_accumulation_plugin: full accumulation options (exclusive with the steps arg).
        step_scheduler_with_optimizer: prepared schedulers step only with a real optimizer step.
        rng_types: generators given the main process's state at each pass of a prepared
            loader ("torch", "cuda", "generator"); None: ["generator"], the shuffling
            sampler's own generator when it has one.
        kwargs_handlers: Accelerate's handlers (``DistributedDataParallelKwargs``,
            ``ProfileKwargs``...), also attributes (``ddp_handler``, ``profile_handler``...).
        dynamo_backend: compile prepared models with ``torch.compile(backend=...)``.
        deepspeed_plugin: Accelerate's DeepSpeed options, instead of ``strategy``.
        fsdp_plugin: Accelerate's FSDP options, instead of ``strategy``.
        megatron_lm_plugin: Accelerate's Megatron-LM options, instead of ``strategy``.
        parallelism_config: a ``ParallelismConfig`` mesh, instead of ``strategy``.
        dynamo_plugin: ``torch.compile`` options, instead of ``dynamo_backend``.
        device_placement: move models and batches to ``self.device``.

    Examples:
        >>> accelerator = Accelerator(gradient_accumulation_steps=2)
        >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        >>> for x, y in loader:
        ...     with accelerator.accumulate(model):
        ...         loss = torch.nn.functional.mse_loss(model(x), y)
        ...         accelerator.backward(loss)
        ...         optimizer.step()
        ...         optimizer.zero_grad()
    """

    def __init__(
        self,
        mixed_precision: str | Precision | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        strategy: str | Strategy | None = None,
        split_batches: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        log_with: Any = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        rng_types: list[str] | None = None,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: str | None = None,
        device_placement: bool = True,
        deepspeed_plugin: plugins.DeepSpeedPlugin | None = None,
        fsdp_plugin: plugins.FullyShardedDataParallelPlugin | None = None,
        megatron_lm_plugin: plugins.MegatronLMPlugin | None = None,
        dynamo_plugin: plugins.TorchDynamoPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
    ) -> None:
        engine = setup_engine(
            strategy, cpu=cpu, mixed_precision=mixed_precision,
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin,
            deepspeed_plugin=deepspeed_plugin, fsdp_plugin=fsdp_plugin,
            megatron_lm_plugin=megatron_lm_plugin, dynamo_plugin=dynamo_plugin,
            dynamo_backend=dynamo_backend, parallelism_config=parallelism_config,
            kwargs_handlers=kwargs_handlers,
        )  # fmt: skip
        plugin = engine.accumulation
        self.dataloader_config = dataloader_config or DataLoaderConfiguration(
            split_batches=split_batches
        )
        self.project_configuration = project_config or ProjectConfiguration(project_dir=project_dir)
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)
        self.strategy = engine.strategy
        self.strategy.precision = engine.precision
        self.strategy.setup_environment()
        watch_launcher()  # a rank whose launcher was killed must not train on, unwatched
        self.state = AcceleratorState(self, cpu=cpu)
        self.gradient_state = GradientState(
            num_steps=plugin.num_steps,
            sync_with_dataloader=plugin.sync_with_dataloader,
            sync_each_batch=plugin.sync_each_batch,
        )
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = rng_types
        self.dynamo_plugin = engine.dynamo_plugin
        self.dynamo_backend = self.dynamo_plugin.backend if self.dynamo_plugin else None
        self.deepspeed_plugin, self.fsdp_plugin = deepspeed_plugin, fsdp_plugin
        self.megatron_lm_plugin, self.parallelism_config = megatron_lm_plugin, parallelism_config
        self.profile_handler: ProfileKwargs | None = None
        vars(self).update(engine.handlers)  # Accelerate's ddp_handler, scaler_handler, ...
        self.device_placement = device_placement
        self._checkpoint_io: AsyncCheckpointIO | None = None  # the last save_state's, if any
        self.log_with = check_log_with(log_with)  # an unknown name fails here, as Accelerate's
        self.trackers: list[Any] = []
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[DataLoaderShard] = []
        self._custom_objects: list[Any] = []
        # by handle id (RemovableHandle keeps a weak reference: an OrderedDict, not a dict)
        self._save_state_pre_hooks: dict[int, Callable[..., None]] = OrderedDict()
        self._load_state_pre_hooks: dict[int, Callable[..., None]] = OrderedDict()
        # Parameters that preparing a model replaced (FSDP2, TP): optimizers follow them.
        self._replaced_parameters: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}

    # ---- facts --------------------------------------------------------------------------
    @property
    def precision(self) -> Precision:
        """The Precision plugin in use."""
        return self.strategy.precision

    @property
    def mixed_precision(self) -> str:
        """Accelerate's name for the mode: "no", "fp16", "bf16" or "fp8"."""
        return self.precision.mixed_precision

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = GradientAccumulationPlugin(num_steps=value).num_steps

    @property
    def sync_gradients(self) -> bool:
        """Whether this batch synchronises gradients and steps the optimizer."""
        return self.gradient_state.sync_gradients

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last step of any prepared optimizer was skipped (fp16 inf/NaN)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    # Accelerate reads these DataLoaderConfiguration fields off the Accelerator too.
    dispatch_batches = property(lambda self: self.dataloader_config.dispatch_batches)
    even_batches = property(lambda self: self.dataloader_config.even_batches)
    use_seedable_sampler = property(lambda self: self.dataloader_config.use_seedable_sampler)
    non_blocking = property(lambda self: self.dataloader_config.non_blocking)
    use_stateful_dataloader = property(lambda self: self.dataloader_config.use_stateful_dataloader)

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The gradient scaler of ``"fp16"`` mixed precision, else None."""
        return getattr(self.precision, "scaler", None)

    save_iteration = property(lambda self: self.project_configuration.iteration)
    is_fsdp2 = property(lambda self: self.distributed_type.value == "FSDP")  # FSDP is FSDP2 here
    multi_device = property(lambda self: self.num_processes > 1 and self.device.type != "cpu")

    @property
    def project_dir(self) -> str | os.PathLike[str] | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | os.PathLike[str] | None:
        return self.project_configuration.logging_dir

    # ---- prepare ------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers, in any order; same order back.

        Models go first, then dataloaders, then optimizers (which may now point at moved
        parameters), then schedulers (which need their prepared optimizer). Anything else is
        returned unchanged.

        Examples:
            >>> model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
        """
        if device_placement is not None and len(device_placement) != len(args):
            raise ConfigurationError(
                f"prepare(device_placement=...): got {len(device_placement)} flags for "
                f"{len(args)} objects; give one bool per object."
            )
        placement = device_placement or [self.device_placement] * len(args)
        result = list(args)
        for index, obj in enumerate(args):
            if isinstance(obj, torch.nn.Module):
                result[index] = self.prepare_model(obj, device_placement=placement[index])
            elif isinstance(obj, DataLoader) and not isinstance(obj, DataLoaderShard):
                result[index] = self.prepare_data_loader(obj, device_placement=placement[index])
        for index, obj in enumerate(args):
            if isinstance(obj, torch.optim.Optimizer):
                result[index] = self.prepare_optimizer(obj, device_placement=placement[index])
        for index, obj in enumerate(args):
            if isinstance(obj, _SCHEDULER_TYPES):
                result[index] = self.prepare_scheduler(obj)
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Convert, place and wrap one model through the strategy (and compile it if asked).
        A model this Accelerator prepared already is returned as it is (as Accelerate)."""
        if any(model is prepared for prepared in self._models):
            return model
        parameters_before = dict(model.named_parameters())
        if device_placement is False:
            model = self.precision.convert_module(model)
        else:
            model = self.strategy.setup_module(model)
        self._replaced_parameters.update(
            parameter_replacements(parameters_before, self.strategy.unwrap_module(model))
        )
        if self.precision.compute_dtype != torch.float32 and self.precision.param_dtype is None:
            inner = self.strategy.unwrap_module(model)  # unwrapped, it autocasts too (Accelerate)
            inner.forward = AutocastForward(inner.forward, self.precision)
        if self.dynamo_plugin is not None:
            model = torch.compile(model, **self.dynamo_plugin.compile_kwargs())
        self._models.append(model)
        return model

    def prepare_data_loader(
        self,
        data_loader: DataLoader,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Any = None,
        *,
        shard: bool = True,
        even_batches: bool | None = None,
    ) -> DataLoaderShard:
        """Wrap a DataLoader for this process: its share, placement, end-of-data tracking, cast.

        ``shard=False``: the loader already gives each process its part. Every process reads
        its own share, so ``slice_fn_for_dispatch`` (Accelerate's, for dispatched batches) is
        accepted and not used. ``even_batches``: this loader's, in place of the
        ``dataloader_config``'s (None keeps it).
        """
        sharding = self.strategy.distributed_sampler_kwargs
        config = self.dataloader_config
        if even_batches is not None and even_batches != config.even_batches:
            config = dataclasses.replace(config, even_batches=even_batches)
        place = self.device_placement if device_placement is None else device_placement
        cast = self.precision.convert_input if self.precision.param_dtype is not None else None
        prepared = prepare_loader_shard(
            data_loader,
            num_processes=sharding["num_replicas"] if shard else 1,
            process_index=sharding["rank"],
            world_size=self.num_processes,
            config=config,
            broadcast=lambda tensor: self.strategy.broadcast(tensor, src=0),
            device=self.device if place else None,
            gradient_state=self.gradient_state,
            transform=cast,
            rng_types=["generator"] if self.rng_types is None else self.rng_types,
        )
        self._dataloaders.append(prepared)
        return prepared

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap an optimizer so it steps through the strategy and honours accumulation.

        With device placement (the Accelerator's by default), state it already holds (loaded
        before ``prepare``) moves to its parameters' devices, as in Accelerate.
        """
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        use_replaced_parameters(optimizer, self._replaced_parameters)  # e.g. sharded by FSDP
        if self.device_placement if device_placement is None else device_placement:
            place_state_with_parameters(optimizer)
        warn_on_eps_below_dtype(optimizer, self.precision.param_dtype)
        optimizer = self.strategy.setup_optimizer(optimizer)
        wrapped = AcceleratedOptimizer(optimizer, self.strategy, self.gradient_state)
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap a scheduler so it steps with its (prepared) optimizer."""
        owners = [
            opt
            for opt in self._optimizers
            if opt.optimizer is scheduler.optimizer or opt is scheduler.optimizer
        ]
        if not owners:
            raise ConfigurationError(
                f"prepare: the scheduler {type(scheduler).__name__} belongs to an optimizer that "
                "was not prepared. Pass its optimizer to accelerator.prepare too (same call or "
                "before)."
            )
        scheduler.optimizer = owners[0].optimizer
        wrapped = AcceleratedScheduler(
            scheduler,
            owners,
            self.gradient_state,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            num_processes=self.strategy.distributed_sampler_kwargs["num_replicas"],  # data replicas
        )
        self._schedulers.append(wrapped)
        return wrapped

    # ---- training -----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate ``loss`` divided by the accumulation steps, scaled where needed.

        ``kwargs`` go to ``loss.backward``; ``backward_fn=f`` runs ``f(loss, **kwargs)`` on the
        scaled loss instead (the Trainer passes a TrainModule's ``backward`` override).
        """
        num_steps = self.gradient_state.num_steps
        if num_steps > 1:
            loss = loss / num_steps
        strategy = self.strategy
        precision = strategy.precision
        # Every batch: where neither the strategy nor its precision plugin changes the base
        # backward, do what they would (loss.backward) without their two calls.
        if (
            type(strategy).backward is _BACKWARD
            and type(precision).backward is _PLAIN_BACKWARD
            and "backward_fn" not in kwargs
        ):
            loss.backward(**kwargs)
        else:
            strategy.backward(loss, self._models[0] if self._models else None, **kwargs)

    def accumulate(self, *models: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Accumulate gradients over ``gradient_accumulation_steps`` batches.

        Inside, ``sync_gradients`` says whether this batch steps; prepared optimizers step and
        zero gradients only then, and gradient synchronisation across processes is skipped on
        the other batches. The last batch of a prepared dataloader always steps.
        """
        is_syncing = self.gradient_state.advance()
        if is_syncing or self.gradient_state.sync_each_batch or not models:
            return _NOTHING
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.strategy.no_backward_sync(model))
        return stack

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip the gradient synchronisation of ``model`` inside the block."""
        return self.strategy.no_backward_sync(model)

    def autocast(
        self, autocast_handler: AutocastKwargs | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """The precision's autocast (none for true ones); ``AutocastKwargs`` overrides it here."""
        return autocast_context(self.precision, autocast_handler)

    def profile(
        self, profile_handler: ProfileKwargs | None = None
    ) -> contextlib.AbstractContextManager[torch.profiler.profile]:
        """Record the block with ``torch.profiler`` and yield the profiler.

        ``profile_handler`` (else the Accelerator's ``ProfileKwargs``) sets what is recorded;
        with its ``output_trace_dir`` every process writes ``profile_<process_index>.json``.
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        return profile_session(handler, self.process_index, self.wait_for_everyone)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Undo loss scaling on the gradients of ``optimizer`` (or of every prepared one)."""
        optimizers = [optimizer] if optimizer is not None else self._optimizers
        for opt in optimizers:
            self.precision.unscale_gradients(getattr(opt, "optimizer", opt))

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the total gradient norm to ``max_norm`` after unscaling; return the norm."""
        self.unscale_gradients()
        model = self._models[0] if self._models else None
        return self.strategy.clip_grad_norm_(model, parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp each gradient element to ``[-clip_value, clip_value]`` after unscaling
        (parameters without a gradient, such as all of them after a skipped step, are left)."""
        self.unscale_gradients()
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        with_grads = [p for p in params if p.grad is not None]
        if with_grads:  # torch raises on a list with no gradient in it
            torch.nn.utils.clip_grad_value_(with_grads, clip_value)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that resumes ``dataloader`` at batch ``num_batches``."""
        return skip_first_batches(dataloader, num_batches)

    # ---- trackers (init_trackers, log, get_tracker: TrackerAPI) ---------------------------
    def end_training(self) -> None:
        """Finish every tracker's run, then end the process group (after a barrier).

        Call it at the end of the script on every process, as in Accelerate. A collective used
        afterwards joins the group again. A background ``save_state`` completes first, and what
        background saves hold (writer thread, host copy, a sharded save's process group) is freed.
        """
        if self._checkpoint_io is not None:
            self._checkpoint_io.close()
        for tracker in self.trackers:
            tracker.finalize("success")
        self.trackers = []
        self.strategy.end_process_group()

    def free_memory(self, *objects: Any, collect_garbage: bool = True) -> list[None]:
        """Drop references to everything prepared, collect garbage (as Accelerate; the Trainer
        passes ``collect_garbage=False``: a full collection costs ~0.1 s with torch loaded) and
        empty the device cache; returns one None per object given, to rebind them
        (``model, opt = accelerator.free_memory(model, opt)``). ``clear`` is the same."""
        for held in (self._models, self._optimizers, self._schedulers, self._dataloaders):
            held.clear()
        self._replaced_parameters.clear()
        empty_device_cache(collect_garbage)
        return [None] * len(objects)

    clear = free_memory

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` (or a submodule) was dispatched over several devices by a device map."""
        return any(len(getattr(m, "hf_device_map", None) or ()) > 1 for m in model.modules())

    def __repr__(self) -> str:
        return (
            f"Accelerator(strategy={self.strategy!r}, mixed_precision={self.mixed_precision!r}, "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )
