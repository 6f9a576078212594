"""DeepSpeedStrategy: ZeRO data parallelism (stages 0-3, CPU/NVMe offload) with DeepSpeed.

What this file owns: the strategy's arguments (Lightning's names), building the engine when the
optimizer is prepared (DeepSpeed needs the model and its optimizer together), backward, clipping
and step through the engine, the module and optimizer state the Trainer/Accelerator ask for, and
what a checkpoint holds (DeepSpeed's shards, or gathered weights for a weights-only one), saved
at once or staged for a background save (`stage_async_save`).

What it does not own: the config translation (``deepspeed_config.py``: arguments and the user's
dict or JSON, filled with what the Trainer and Accelerator already know, so the user states each
once), importing DeepSpeed and the prepared-model wrapper (``deepspeed_engine.py``), DeepSpeed's
checkpoint files (``deepspeed_checkpoint.py``), the process group and the collectives (inherited
from DDPStrategy), gradient accumulation (the Accelerator's: DeepSpeed runs with
``gradient_accumulation_steps=1`` and ``managed_gradient_accumulation=false``, so gradients add
up locally until the Accelerator's optimizer step calls ``engine.step()``, and one
``engine.step()`` is one optimizer step), and the checkpoint format (``trainer.checkpoint``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigurationError, StrategyError
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.deepspeed_checkpoint import (
    ENGINE_DIR,
    STATE_KEY,
    EngineState,
    StagedCheckpoint,
    check_optimizer_placeholder,
    load_engine_weights,
    load_into_engine,
    optimizer_placeholder,
    save_engine_checkpoint,
    stage_engine_checkpoint,
    stage_full_checkpoint,
    with_gathered_weights,
)
from trainer.strategies.deepspeed_config import (
    check_logging_batch_size,
    fill_engine_config,
    is_positive_int,
    merge_config,
    precision_section,
    read_user_config,
    to_number,
    zero_section,
)
from trainer.strategies.deepspeed_engine import (
    DeepSpeedModel,
    check_installed,
    import_deepspeed,
    initialize_engine,
    is_partitioned,
    set_clipping,
)
from trainer.strategies.environment import ClusterEnvironment

# ENGINE_DIR, DeepSpeedModel and load_engine_weights are re-exported: this was their module before
# the split, and `trainer checkpoint consolidate` and the tests import them from here.
__all__ = ["ENGINE_DIR", "DeepSpeedModel", "DeepSpeedStrategy", "load_engine_weights"]


class DeepSpeedStrategy(DDPStrategy):
    """DeepSpeed ZeRO over all processes of the job, with Lightning's argument names.

    Args:
        accelerator: "cpu", "cuda" or None (CUDA when available).
        precision: the Precision plugin (the Accelerator fills it in): "32-true", "bf16-mixed",
            "bf16-true" (DeepSpeed's ``bf16``), "16-mixed", "16-true" (its ``fp16``, GPU only).
        stage: the ZeRO stage: 0 (plain data parallel), 1 (optimizer states sharded),
            2 (+ gradients), 3 (+ parameters).
        config: a DeepSpeed config (dict or JSON path), laid over the arguments; what it leaves
            out or sets to "auto" comes from them and from the Trainer/Accelerator (precision,
            micro batch size, ``gradient_clipping``: 0 unless asked). ``optimizer``,
            ``scheduler``, ``train_batch_size`` and ``gradient_accumulation_steps`` are refused.
        offload_optimizer: keep optimizer states on ``offload_optimizer_device``: "cpu" or
            "nvme" (with ``nvme_path``).
        offload_parameters: keep parameters (stage 3) on ``offload_params_device``: "cpu" or
            "nvme" (with ``nvme_path``).
        contiguous_gradients: a ``zero_optimization`` option.
        overlap_comm: a ``zero_optimization`` option, for stages 2-3 (stages 0-1 reduce inside
            ``step()``, after the last backward).
        allgather_partitions: a ``zero_optimization`` option.
        reduce_scatter: a ``zero_optimization`` option.
        allgather_bucket_size: a ``zero_optimization`` option.
        reduce_bucket_size: a ``zero_optimization`` option.
        sub_group_size: a ``zero_optimization`` option.
        pin_memory: a ``zero_optimization`` option (pinned offload buffers).
        zero_optimization: False leaves the ``zero_optimization`` section out (stage 0).
        logging_level: the level of DeepSpeed's logger.
        logging_batch_size_per_gpu: ``train_micro_batch_size_per_gpu`` (DeepSpeed's bookkeeping);
            "auto": the train DataLoader's batch size, 1 if none is known.
        loss_scale: fp16 loss scale; 0 is dynamic scaling.
        initial_scale_power: dynamic scaling starts at ``2**initial_scale_power``.
        loss_scale_window: steps without overflow before the scale grows.
        hysteresis: overflows tolerated before the scale shrinks.
        min_loss_scale: the smallest dynamic scale.
        exclude_frozen_parameters: leave frozen parameters out of checkpoints.
        process_group_backend: as for DDPStrategy.
        timeout: as for DDPStrategy.
        environment: as for DDPStrategy.

    Examples:
        >>> Trainer(strategy=DeepSpeedStrategy(stage=3, offload_optimizer=True), devices=2)
    """

    name = "deepspeed"
    should_keep_process_group = True  # its sharded state / engine holds the group after fit
    forward_needs_all_processes = True  # gathers shards or tensor-parallel parts

    def __init__(
        self,
        accelerator: str | None = None,
        *,
        precision: Precision | None = None,
        zero_optimization: bool = True,
        stage: int = 2,
        config: dict[str, Any] | str | os.PathLike[str] | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_optimizer_device: str = "cpu",
        offload_params_device: str = "cpu",
        nvme_path: str | None = None,
        pin_memory: bool = False,
        sub_group_size: int = 1_000_000_000_000,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_partitions: bool = True,
        reduce_scatter: bool = True,
        allgather_bucket_size: float = 2e8,
        reduce_bucket_size: float = 2e8,
        logging_level: int = logging.WARN,
        logging_batch_size_per_gpu: int | str = "auto",
        loss_scale: float = 0,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: int = 1,
        exclude_frozen_parameters: bool = False,
        process_group_backend: str | None = None,
        timeout: dt.timedelta = dt.timedelta(minutes=30),
        environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(
            accelerator, precision=precision, process_group_backend=process_group_backend,
            timeout=timeout, environment=environment,
        )  # fmt: skip
        check_installed()
        user_config = read_user_config(config)
        zero = zero_section(
            stage, offload_optimizer and offload_optimizer_device,
            offload_parameters and offload_params_device, nvme_path, pin_memory=pin_memory,
            sub_group_size=int(sub_group_size), contiguous_gradients=contiguous_gradients,
            overlap_comm=overlap_comm, allgather_partitions=allgather_partitions,
            reduce_scatter=reduce_scatter, allgather_bucket_size=int(allgather_bucket_size),
            reduce_bucket_size=int(reduce_bucket_size))  # fmt: skip
        defaults: dict[str, Any] = {"zero_allow_untested_optimizer": True}
        if zero_optimization:
            defaults["zero_optimization"] = zero
        self.config: dict[str, Any] = merge_config(defaults, user_config)
        self._user_clipping = to_number(user_config.get("gradient_clipping"))
        self._user_micro_batch = to_number(user_config.get("train_micro_batch_size_per_gpu"))
        self.logging_batch_size_per_gpu = check_logging_batch_size(logging_batch_size_per_gpu)
        self.logging_level = logging_level
        self.loss_scaling = {
            "loss_scale": loss_scale, "initial_scale_power": initial_scale_power,
            "loss_scale_window": loss_scale_window, "hysteresis": hysteresis,
            "min_loss_scale": min_loss_scale,
        }  # fmt: skip
        self.exclude_frozen_parameters = exclude_frozen_parameters
        self._loader_batch_size: int | None = None
        self._waiting: list[DeepSpeedModel] = []  # prepared models without an engine yet
        self._engine: Any = None
        self._is_running = False  # an engine was built in this run (until teardown)
        self._restored: set[int] = set()  # ids of optimizers engine.load_checkpoint restored

    # ---- facts -------------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:  # type: ignore[override]
        return DistributedType.DEEPSPEED

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage the engine runs (0 without a ``zero_optimization`` section)."""
        return int(self.config.get("zero_optimization", {}).get("stage", 0))

    @property
    def engine(self) -> Any:
        """The ``deepspeed.DeepSpeedEngine`` once the optimizer is prepared, else None."""
        return self._engine

    def engine_config(self, micro_batch_size: int | None = None) -> dict[str, Any]:
        """The complete config handed to ``deepspeed.initialize`` (see the class docstring).

        Raises:
            ConfigurationError: the precision has no DeepSpeed mode, or the config disagrees
                with it.
        """
        logging_batch = self.logging_batch_size_per_gpu
        micro = (
            self._user_micro_batch
            or micro_batch_size
            or (logging_batch if is_positive_int(logging_batch) else self._loader_batch_size)
            or 1
        )
        return fill_engine_config(
            self.config,
            micro_batch_size=int(micro),
            gradient_clipping=self._user_clipping or 0.0,  # DeepSpeed's default would be 1.0
            precision_name=self.precision.name,
            accelerator_type=self.accelerator_type,
            loss_scaling=self.loss_scaling,
        )

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Check the precision, import DeepSpeed, join (or, for one process, start) the group."""
        precision_section(self.precision.name, self.accelerator_type)
        deepspeed = import_deepspeed(self.accelerator_type)
        deepspeed.utils.logging.logger.setLevel(self.logging_level)
        self._start_or_join_process_group()
        if getattr(self.precision, "scaler", None) is not None:
            self.precision.scaler = None  # DeepSpeed scales fp16 losses itself (its fp16 section)

    def _start_single_process_group(self) -> None:
        """DeepSpeed needs a process group even for one process: a 1-rank group in memory."""
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine reads it
        super()._start_single_process_group()

    def process_dataloader(self, dataloader: Any) -> Any:
        """Note the train loader's batch size (``train_micro_batch_size_per_gpu``); unchanged."""
        batch_size = getattr(dataloader, "batch_size", None)
        if self._loader_batch_size is None and is_positive_int(batch_size):
            self._loader_batch_size = int(batch_size)
        return dataloader

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert and place the module; the engine is built when its optimizer is prepared."""
        if isinstance(module, DeepSpeedModel):
            return module
        engine = self._engine
        if not (engine is not None and engine.module is module) and not is_partitioned(module):
            module = self.precision.convert_module(module).to(self.root_device)
        wrapper = DeepSpeedModel(module)
        if engine is not None and engine.module is module:
            wrapper.__dict__["engine"] = engine  # evaluating after fit; a new fit rebuilds it
        self._waiting.append(wrapper)
        return wrapper

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Build the engine from the model owning ``optimizer``'s parameters; return its optimizer.

        Raises:
            StrategyError: no prepared model owns the parameters, or a second optimizer is
                prepared in the same run (DeepSpeed trains one model with one optimizer).
        """
        if self._engine is not None and optimizer is self._engine.optimizer:
            return optimizer
        if self._is_running:
            raise StrategyError(
                "DeepSpeedStrategy: a second optimizer was prepared; DeepSpeed trains one model "
                "with one optimizer. Return one optimizer from configure_optimizers (parameter "
                "groups can hold different learning rates)."
            )
        wrapper = self._owner(optimizer)
        engine, engine_optimizer = initialize_engine(
            wrapper.module, optimizer, self.engine_config(), self.accelerator_type
        )
        wrapper.__dict__["engine"] = engine
        self._waiting = [w for w in self._waiting if w is not wrapper]
        self._engine = engine
        self._is_running = True
        self._restored.clear()
        return engine_optimizer

    def _owner(self, optimizer: torch.optim.Optimizer) -> DeepSpeedModel:
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for wrapper in reversed(self._waiting):
            if any(id(p) in params for p in wrapper.module.parameters()):
                return wrapper
        raise StrategyError(
            "DeepSpeedStrategy: the optimizer's parameters belong to no prepared model. Prepare "
            "the model first (in the same prepare call, or before) and build the optimizer on "
            "its parameters."
        )

    # ---- training ----------------------------------------------------------------------
    def _require_engine(self, verb: str) -> Any:
        if self._engine is None:
            raise StrategyError(
                f"DeepSpeedStrategy.{verb}: there is no DeepSpeed engine yet. Prepare the model "
                "and its optimizer first: accelerator.prepare(model, optimizer, ...)."
            )
        return self._engine

    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None, **kwargs: Any) -> None:
        """``engine.backward(loss)``; the Accelerator already divided ``loss`` for accumulation."""
        engine = self._require_engine("backward")
        retain_graph = bool(kwargs.pop("retain_graph", False))
        if kwargs:
            raise ConfigurationError(
                f"backward(**{sorted(kwargs)}): DeepSpeed's engine.backward accepts only "
                "retain_graph. Remove the other arguments."
            )
        engine.backward(loss, retain_graph=retain_graph, scale_wrt_gas=False)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``engine.step()``: reduce, clip, step, zero; False when fp16 overflow skipped it."""
        engine = self._require_engine("optimizer_step")
        engine.step()
        return bool(engine.was_step_applied())

    @contextlib.contextmanager
    def no_backward_sync(self, module: torch.nn.Module) -> Iterator[None]:
        """Nothing to do: the engine accumulates locally until ``step()`` (stages 0-1), and
        ZeRO-2/3 reduce-scatter every backward by design."""
        yield

    def clip_grad_norm_(
        self,
        module: torch.nn.Module | None,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Set DeepSpeed's clipping threshold for the coming ``step()``, which clips.

        DeepSpeed measures the norm of the partitioned gradients inside ``step()``: it is not
        known here, so the result is NaN (``engine.get_global_grad_norm()`` after the step).

        Raises:
            ConfigurationError: ``norm_type`` is not 2, or the config's ``gradient_clipping``
                differs from ``max_norm``.
        """
        if norm_type != 2.0:
            raise ConfigurationError(
                f"clip_grad_norm_(norm_type={norm_type}): DeepSpeed clips the 2-norm only. Use "
                "norm_type=2."
            )
        if self._user_clipping and self._user_clipping != max_norm:
            raise ConfigurationError(
                f"gradient clipping is stated twice: the DeepSpeed config says gradient_clipping="
                f"{self._user_clipping} and the Trainer/Accelerator asks for {max_norm}. Keep one."
            )
        set_clipping(self._require_engine("clip_grad_norm_"), max_norm)
        return torch.tensor(float("nan"))

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if isinstance(module, DeepSpeedModel):
            module = module.module
        engine = self._engine
        return engine.module if engine is not None and module is engine else module

    # ---- state -------------------------------------------------------------------------
    def module_state_dict(self, module: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        """The module's state dict; ZeRO-3 parameters are gathered when ``full``."""
        module = self.unwrap_module(module)
        if not full or not is_partitioned(module):
            return module.state_dict()
        deepspeed = import_deepspeed(self.accelerator_type)
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load weights into the module (ZeRO-3: gathered, then re-partitioned) and the engine's
        fp32 master copy."""
        if isinstance(state_dict, EngineState):
            return  # engine.load_checkpoint restored them
        module = self.unwrap_module(module)
        if is_partitioned(module):
            deepspeed = import_deepspeed(self.accelerator_type)
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
                module.load_state_dict(state_dict, strict=strict)
        else:
            module.load_state_dict(state_dict, strict=strict)
        engine = self._engine
        if engine is not None and any(m is module for m in engine.module.modules()):
            if hasattr(engine.optimizer, "refresh_fp32_params"):
                engine.optimizer.refresh_fp32_params()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """A placeholder: the optimizer state is written by ``engine.save_checkpoint`` (sharded)."""
        return optimizer_placeholder(self.zero_stage)

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        """Accept the placeholder once ``engine.load_checkpoint`` restored this optimizer.

        Raises:
            CheckpointError: the state was not restored by the engine (saved elsewhere, or by
                ``Accelerator.save_state``, which does not write DeepSpeed's shards).
        """
        check_optimizer_placeholder(
            optimizer, state_dict, is_restored=id(optimizer) in self._restored
        )

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """Every rank writes DeepSpeed's shards into a staging directory; rank 0 commits.

        The committed directory holds ``deepspeed/`` (DeepSpeed's files), ``state.json`` and the
        manifest listing every file. A weights-only checkpoint (no ``optimizer_states``) is one
        gathered ``model.safetensors`` instead.
        """
        engine = self._engine
        if engine is None or "optimizer_states" not in checkpoint:
            super().save_checkpoint(path, self._gathered(checkpoint))
            return
        save_engine_checkpoint(self, engine, path, checkpoint, **self._engine_save_options())

    def stage_async_save(
        self,
        path: str | os.PathLike[str],
        checkpoint: dict[str, Any],
        *,
        stage: Callable[[Any], Any],
    ) -> StagedCheckpoint | None:
        """`save_checkpoint` for ``AsyncCheckpointIO``: every rank, on the training thread, runs
        ``engine.save_checkpoint`` with a checkpoint engine that copies each state dict with
        ``stage`` (to host memory) instead of writing it (weights-only: gathered, copied).

        Returns:
            What ``trainer.plugins`` writes and commits on its writer thread; None when this
            engine's files must be written at once (`stage_engine_checkpoint`).

        Raises:
            CheckpointError: on every rank, when ``path`` cannot hold the checkpoint.
        """
        engine = self._engine
        if engine is None or "optimizer_states" not in checkpoint:
            return stage_full_checkpoint(self, path, self._gathered(checkpoint), stage=stage)
        options = self._engine_save_options()
        return stage_engine_checkpoint(self, engine, path, checkpoint, stage=stage, **options)

    def _gathered(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """``checkpoint`` with ZeRO-3's weights gathered (a collective: every rank calls it)."""
        engine = self._engine
        if engine is None or not is_partitioned(engine.module):
            return checkpoint
        return with_gathered_weights(checkpoint, self.module_state_dict(engine.module, full=True))

    def _engine_save_options(self) -> dict[str, Any]:
        version = import_deepspeed(self.accelerator_type).__version__
        exclude = self.exclude_frozen_parameters
        return dict(zero_stage=self.zero_stage, version=version, exclude_frozen_parameters=exclude)

    def load_checkpoint(
        self, path: str | os.PathLike[str], module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        """Verify the manifest, then ``engine.load_checkpoint`` (weights, optimizer, counters).

        Without an engine (validate/test/predict) the weights are consolidated from the shards.

        Raises:
            CheckpointError: the checkpoint does not fit the engine (another world size or stage).
        """
        directory = Path(path)
        if not (directory / ENGINE_DIR).is_dir():
            return super().load_checkpoint(path, module)
        from trainer.checkpoint.rank_hashing import read_checkpoint_by_shares

        # every file verified (each rank its share of the shards) before DeepSpeed reads one
        checkpoint = read_checkpoint_by_shares(self, directory, ENGINE_DIR)
        engine = self._engine
        if engine is None:
            checkpoint["state_dict"] = load_engine_weights(directory, checkpoint.get(STATE_KEY))
            return checkpoint
        load_into_engine(engine, directory, checkpoint.get(STATE_KEY))
        self._restored.add(id(engine.optimizer))
        checkpoint["state_dict"] = EngineState()
        checkpoint["optimizer_states"] = [self.optimizer_state_dict(engine.optimizer)]
        return checkpoint

    def teardown(self) -> None:
        """End the run; the engine stays for saves after fit (the next fit builds a new one).

        Unlike DDPStrategy there is no ``gc.collect()`` here: nothing is dropped, and with
        DeepSpeed imported a collection costs about a second.
        """
        self._is_running = False
        self._waiting.clear()

    def __repr__(self) -> str:
        return (
            f"DeepSpeedStrategy(stage={self.zero_stage}, device={self.root_device}, "
            f"world_size={self.world_size}, precision={self.precision.name!r})"
        )
