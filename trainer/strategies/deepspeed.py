"""DeepSpeedStrategy: ZeRO data parallelism (stages 0-3, CPU/NVMe offload) with DeepSpeed.

What this file owns: the DeepSpeed config (built from Lightning-named arguments and/or a user
dict or JSON file, then filled with what the Trainer and Accelerator already know — precision,
micro batch size, clipping — so the user states each once), the engine (built when the optimizer
is prepared, because DeepSpeed needs the model and its optimizer together), backward and step
through the engine, and checkpoints written by DeepSpeed's own ``save_checkpoint`` inside the
atomic checkpoint directory, plus reading them back in one process (``trainer checkpoint
consolidate``).

What it does not own: the process group and the collectives (inherited from DDPStrategy),
gradient accumulation (the Accelerator's: DeepSpeed runs with ``gradient_accumulation_steps=1``
and ``managed_gradient_accumulation=false``, so gradients add up locally until the Accelerator's
optimizer step calls ``engine.step()``, and one ``engine.step()`` is one optimizer step), and the
checkpoint format (``trainer.checkpoint``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.errors import CheckpointError, ConfigurationError, StrategyError, describe
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.ddp import DDPStrategy, hold_no_group_in_default_arguments
from trainer.strategies.environment import ClusterEnvironment

__all__ = ["ENGINE_DIR", "DeepSpeedModel", "DeepSpeedStrategy", "load_engine_weights"]

ENGINE_DIR = "deepspeed"  # the checkpoint's sub-directory that holds DeepSpeed's own files
STATE_KEY = "deepspeed"  # state.json entry: tag, ZeRO stage, key prefix, DeepSpeed version
_TAG = "checkpoint"  # DeepSpeed's tag (sub-directory) inside ENGINE_DIR
_MIN_VERSION = (0, 19, 4)  # the first release with managed_gradient_accumulation=false
_SAVED_BY_ENGINE = "deepspeed"  # optimizer_state_dict's placeholder: {"saved_by": "deepspeed"}
_PRECISION_SECTIONS = {  # precision name -> the DeepSpeed config section it enables
    "32-true": None, "bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16",
    "16-true": "fp16",
}  # fmt: skip
_OWNERS = {  # config keys the Trainer/Accelerator own, and where the user states them
    "optimizer": "configure_optimizers (or the optimizer you prepare)",
    "scheduler": "configure_optimizers' lr_scheduler (or the scheduler you prepare)",
    "train_batch_size": "the DataLoader's batch_size x processes x accumulate_grad_batches",
    "gradient_accumulation_steps": "Trainer(accumulate_grad_batches=N) / "
    "Accelerator(gradient_accumulation_steps=N)",
}


class DeepSpeedModel(torch.nn.Module):
    """The prepared model: its forward runs through the DeepSpeed engine once that exists.

    The Accelerator prepares models before optimizers, and DeepSpeed builds its engine from both,
    so ``prepare`` returns this wrapper and ``setup_optimizer`` binds the engine to it
    (``model.engine``, None until then: evaluation without an optimizer runs the module itself).
    Attributes the wrapper lacks come from the engine (``model.global_steps``).
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.__dict__["engine"] = None  # not a registered child: the engine wraps the same module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        engine = self.__dict__["engine"]
        return (engine if engine is not None else self.module)(*args, **kwargs)

    def train(self, mode: bool = True) -> DeepSpeedModel:
        super().train(mode)
        if self.__dict__["engine"] is not None:
            self.__dict__["engine"].train(mode)
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            engine = self.__dict__.get("engine")
            if engine is None:
                raise
            return getattr(engine, name)


class _EngineState(dict):
    """Stands for weights or optimizer state that ``engine.load_checkpoint`` already restored."""


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
        _check_installed()
        if config is None and os.environ.get("TRAINER_DEEPSPEED_CONFIG"):
            config = json.loads(os.environ["TRAINER_DEEPSPEED_CONFIG"])  # from `trainer launch`
        user_config = _read_config(config)
        zero = _zero_section(
            stage, offload_optimizer and offload_optimizer_device,
            offload_parameters and offload_params_device, nvme_path, pin_memory=pin_memory,
            sub_group_size=int(sub_group_size), contiguous_gradients=contiguous_gradients,
            overlap_comm=overlap_comm, allgather_partitions=allgather_partitions,
            reduce_scatter=reduce_scatter, allgather_bucket_size=int(allgather_bucket_size),
            reduce_bucket_size=int(reduce_bucket_size),
        )  # fmt: skip
        defaults: dict[str, Any] = {"zero_allow_untested_optimizer": True}
        if zero_optimization:
            defaults["zero_optimization"] = zero
        self.config: dict[str, Any] = _merge(defaults, user_config)
        self._user_clipping = _number(user_config.get("gradient_clipping"))
        self._user_micro_batch = _number(user_config.get("train_micro_batch_size_per_gpu"))
        if logging_batch_size_per_gpu != "auto" and not _is_positive_int(
            logging_batch_size_per_gpu
        ):
            raise ConfigurationError(
                "DeepSpeedStrategy(logging_batch_size_per_gpu="
                f"{describe(logging_batch_size_per_gpu)}): expected 'auto' or a positive int."
            )
        self.logging_batch_size_per_gpu = logging_batch_size_per_gpu
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
        config = _merge({}, self.config)
        logging_batch = self.logging_batch_size_per_gpu
        micro = (
            self._user_micro_batch
            or micro_batch_size
            or (logging_batch if _is_positive_int(logging_batch) else self._loader_batch_size)
            or 1
        )
        config["train_micro_batch_size_per_gpu"] = int(micro)
        config["gradient_accumulation_steps"] = 1  # the Accelerator accumulates; see the docstring
        config["managed_gradient_accumulation"] = False
        config["gradient_clipping"] = self._user_clipping or 0.0  # DeepSpeed's default would be 1.0
        config.setdefault("steps_per_print", 2**31 - 1)
        config.setdefault("wall_clock_breakdown", False)
        zero = config.get("zero_optimization", {})
        if zero.get("offload_optimizer", {}).get("device", "none") != "none":
            # The optimizer is the user's torch optimizer, not DeepSpeedCPUAdam (compiled on use).
            config.setdefault("zero_force_ds_cpu_optimizer", False)
        section = self._precision_section()
        for name in ("fp16", "bf16"):
            stated = config.get(name, {}).get("enabled")
            if stated not in (None, "auto") and bool(stated) != (name == section):
                raise ConfigurationError(
                    f"DeepSpeedStrategy(config={{'{name}': {{'enabled': {stated}}}}}) disagrees "
                    f"with precision={self.precision.name!r}. State the precision once: drop "
                    f"'{name}' from the config and set Trainer(precision=...) / "
                    "Accelerator(mixed_precision=...)."
                )
            if name != section:
                config.pop(name, None)
        if section == "fp16":
            config["fp16"] = {**self.loss_scaling, **config.get("fp16", {}), "enabled": True}
        elif section == "bf16":
            config["bf16"] = {**config.get("bf16", {}), "enabled": True}
        return _drop_auto(config)

    def _precision_section(self) -> str | None:
        name = self.precision.name
        if name not in _PRECISION_SECTIONS:
            raise ConfigurationError(
                f"DeepSpeedStrategy: precision={name!r} has no DeepSpeed mode. Expected one of "
                f"{sorted(_PRECISION_SECTIONS)}."
            )
        section = _PRECISION_SECTIONS[name]
        if section == "fp16" and self.accelerator_type == "cpu":
            raise ConfigurationError(
                f"DeepSpeedStrategy: precision={name!r} needs a GPU (DeepSpeed refuses fp16 on "
                "CPU). Use precision='bf16-mixed' on CPU."
            )
        return section

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Check the precision, import DeepSpeed, join (or, for one process, start) the group."""
        self._precision_section()
        deepspeed = _import_deepspeed(self.accelerator_type)
        deepspeed.utils.logging.logger.setLevel(self.logging_level)
        if not dist.is_initialized() and not self.environment.is_distributed:
            self._start_single_process_group()
        super().setup_environment()
        if getattr(self.precision, "scaler", None) is not None:
            self.precision.scaler = None  # DeepSpeed scales fp16 losses itself (its fp16 section)

    def _start_single_process_group(self) -> None:
        """DeepSpeed needs a process group even for one process: a 1-rank group in memory."""
        backend = self.process_group_backend or (
            "nccl" if self.accelerator_type == "cuda" else "gloo"
        )
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine reads it
        if self.accelerator_type == "cuda":
            torch.cuda.set_device(self.root_device)
        hold_no_group_in_default_arguments()
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=self.timeout
        )
        self._adopt_process_group()

    def process_dataloader(self, dataloader: Any) -> Any:
        """Note the train loader's batch size (``train_micro_batch_size_per_gpu``); unchanged."""
        batch_size = getattr(dataloader, "batch_size", None)
        if self._loader_batch_size is None and _is_positive_int(batch_size):
            self._loader_batch_size = int(batch_size)
        return dataloader

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert and place the module; the engine is built when its optimizer is prepared."""
        if isinstance(module, DeepSpeedModel):
            return module
        engine = self._engine
        if not (engine is not None and engine.module is module) and not _is_partitioned(module):
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
        deepspeed = _import_deepspeed(self.accelerator_type)
        config = self.engine_config()
        try:
            engine, engine_optimizer, _, _ = deepspeed.initialize(
                model=wrapper.module, optimizer=optimizer, config=config, dist_init_required=False
            )
        except (ValueError, AssertionError, RuntimeError, TypeError) as err:
            raise StrategyError(
                f"deepspeed.initialize refused the config {json.dumps(config, default=str)}: "
                f"{err}. Fix the DeepSpeedStrategy arguments or its config."
            ) from err
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
        engine = self._require_engine("clip_grad_norm_")
        # DeepSpeed 0.19 has no setter: the optimizer wrappers read clip_grad at step time and
        # stage 0 without a wrapper reads the config.
        engine._config.gradient_clipping = float(max_norm)
        if hasattr(engine.optimizer, "clip_grad"):
            engine.optimizer.clip_grad = float(max_norm)
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
        if not full or not _is_partitioned(module):
            return module.state_dict()
        deepspeed = _import_deepspeed(self.accelerator_type)
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def load_module_state_dict(
        self, module: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load weights into the module (ZeRO-3: gathered, then re-partitioned) and the engine's
        fp32 master copy."""
        if isinstance(state_dict, _EngineState):
            return  # engine.load_checkpoint restored them
        module = self.unwrap_module(module)
        if _is_partitioned(module):
            deepspeed = _import_deepspeed(self.accelerator_type)
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
        return {"saved_by": _SAVED_BY_ENGINE, "zero_stage": self.zero_stage}

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        """Accept the placeholder once ``engine.load_checkpoint`` restored this optimizer.

        Raises:
            CheckpointError: the state was not restored by the engine (saved elsewhere, or by
                ``Accelerator.save_state``, which does not write DeepSpeed's shards).
        """
        is_placeholder = state_dict.get("saved_by") == _SAVED_BY_ENGINE
        if is_placeholder and id(optimizer) in self._restored:
            return
        where = (
            "its state lives in DeepSpeed's shards of a checkpoint directory; resume with "
            "fit(ckpt_path=...) / strategy.load_checkpoint on a checkpoint that "
            "trainer.save_checkpoint / strategy.save_checkpoint wrote"
            if is_placeholder
            else "it is a torch optimizer's state from another strategy; load only the weights "
            "(module.load_state_dict(read_checkpoint(path)['state_dict'])) and fit without "
            "ckpt_path"
        )
        raise CheckpointError(
            f"DeepSpeedStrategy: this optimizer state cannot be loaded into DeepSpeed's "
            f"{type(optimizer).__name__}: {where}."
        )

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """Every rank writes DeepSpeed's shards into a staging directory; rank 0 commits.

        The committed directory holds ``deepspeed/`` (DeepSpeed's files), ``state.json`` and the
        manifest listing every file. A weights-only checkpoint (no ``optimizer_states``) is one
        gathered ``model.safetensors`` instead.
        """
        engine = self._engine
        if engine is None or "optimizer_states" not in checkpoint:
            self._save_weights_only(path, checkpoint)
            return
        from trainer.checkpoint.sharded import save_staged_checkpoint

        rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        prefix = _key_prefix(engine.module.state_dict(), checkpoint.get("state_dict", {}))
        version = _import_deepspeed(self.accelerator_type).__version__
        rest[STATE_KEY] = {
            "tag": _TAG, "zero_stage": self.zero_stage, "module_prefix": prefix, "version": version
        }  # fmt: skip

        def write_engine_shards(staging: Path) -> None:  # every rank writes its own
            engine.save_checkpoint(
                str(staging),
                tag=_TAG,
                client_state={},
                save_latest=False,
                exclude_frozen_parameters=self.exclude_frozen_parameters,
            )

        save_staged_checkpoint(self, path, ENGINE_DIR, write_engine_shards, rest)

    def _save_weights_only(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        engine = self._engine
        if engine is not None and _is_partitioned(engine.module):
            full = self.module_state_dict(engine.module, full=True)  # collective: every rank
            prefix = _key_prefix(full.keys(), checkpoint.get("state_dict", {}).keys())
            state = {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
            checkpoint = {**checkpoint, "state_dict": state}
        super().save_checkpoint(path, checkpoint)

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
        from trainer.checkpoint import read_checkpoint

        checkpoint = read_checkpoint(directory)  # every file's sha256 before DeepSpeed reads one
        engine = self._engine
        if engine is None:
            checkpoint["state_dict"] = load_engine_weights(directory, checkpoint.get(STATE_KEY))
            return checkpoint
        tag = _checked_tag(directory, checkpoint.get(STATE_KEY))
        try:
            with _weights_only_engine_loads(engine):
                loaded, _ = engine.load_checkpoint(
                    str(directory / ENGINE_DIR), tag=tag, load_lr_scheduler_states=False
                )
        except (RuntimeError, ValueError, KeyError, AssertionError, FileNotFoundError) as err:
            raise CheckpointError(
                f"{directory}: DeepSpeed could not load it into this engine ({err}). Resume with "
                "the same number of processes and ZeRO stage, or consolidate it (`trainer "
                "checkpoint consolidate`) and load the weights."
            ) from err
        if loaded is None:
            raise CheckpointError(f"{directory}: DeepSpeed found no checkpoint with tag {tag!r}.")
        self._restored.add(id(engine.optimizer))
        checkpoint["state_dict"] = _EngineState()
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


# ---- config --------------------------------------------------------------------------------
def _zero_section(
    stage: int, offload_optimizer: str | bool, offload_param: str | bool, nvme_path: str | None,
    *, pin_memory: bool, **options: Any,
) -> dict[str, Any]:  # fmt: skip
    """The ``zero_optimization`` section the arguments describe, checked at construction.

    ``offload_optimizer`` / ``offload_param`` are the device ("cpu", "nvme") or False when off.
    """
    if stage not in (0, 1, 2, 3):
        raise ConfigurationError(
            f"DeepSpeedStrategy(stage={describe(stage)}): expected a ZeRO stage 0, 1, 2 or 3."
        )
    zero: dict[str, Any] = {"stage": stage, **options}
    if stage < 2:
        # Stages 0-1 reduce inside step() (gradients accumulate locally until then), so there is
        # no backward to overlap with: DeepSpeed refuses overlap_comm there in this mode.
        zero.pop("overlap_comm")
    for key, device, argument in (
        ("offload_optimizer", offload_optimizer, "offload_optimizer_device"),
        ("offload_param", offload_param, "offload_params_device"),
    ):
        if not device:
            continue
        if device not in ("cpu", "nvme"):
            raise ConfigurationError(
                f"DeepSpeedStrategy({argument}={describe(device)}): expected 'cpu' or 'nvme'."
            )
        if device == "nvme" and not nvme_path:
            raise ConfigurationError(
                f"DeepSpeedStrategy({argument}='nvme') needs nvme_path: the directory on the "
                "NVMe drive to swap to."
            )
        zero[key] = {"device": device, "pin_memory": pin_memory}
        if device == "nvme":
            zero[key]["nvme_path"] = nvme_path
    if offload_param and stage != 3:
        raise ConfigurationError(
            f"DeepSpeedStrategy(offload_parameters=True, stage={stage}): parameters are "
            "partitioned (and offloadable) only in ZeRO stage 3. Set stage=3."
        )
    if offload_optimizer and stage == 0:
        raise ConfigurationError(
            "DeepSpeedStrategy(offload_optimizer=True, stage=0): optimizer offload needs ZeRO "
            "stage 1, 2 or 3."
        )
    return zero


def _read_config(config: dict[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any]:
    """The user's config as a dict (a JSON file is read), with the keys the Trainer owns refused."""
    if config is None:
        return {}
    if isinstance(config, str | os.PathLike):
        path = Path(config)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise ConfigurationError(
                f"DeepSpeedStrategy(config={os.fspath(path)!r}): no such file. Give a JSON file "
                "path or a dict."
            ) from err
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigurationError(
                f"DeepSpeedStrategy(config={os.fspath(path)!r}) is not readable JSON: {err}."
            ) from err
    if not isinstance(config, dict):
        raise ConfigurationError(
            f"DeepSpeedStrategy(config={describe(config)}): expected a dict or a JSON file path."
        )
    for key, owner in _OWNERS.items():
        value = config.get(key)
        if value in (None, "auto") or (key == "gradient_accumulation_steps" and value == 1):
            continue
        raise ConfigurationError(
            f"DeepSpeedStrategy(config={{'{key}': {describe(value)}}}): {key} comes from {owner}. "
            f"Remove it from the config (or set it to 'auto')."
        )
    return config


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, nested dicts merged key by key (copies, inputs kept)."""
    merged = {k: _merge({}, v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = _merge({}, value) if isinstance(value, dict) else value
    return merged


def _drop_auto(config: dict[str, Any]) -> dict[str, Any]:
    """Leave out the "auto" values nobody filled, so DeepSpeed uses its defaults for them."""
    return {
        k: _drop_auto(v) if isinstance(v, dict) else v for k, v in config.items() if v != "auto"
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# ---- DeepSpeed and its checkpoints ----------------------------------------------------------
def _check_installed() -> None:
    """Fail at construction, without importing DeepSpeed (slow), when it is not installed."""
    from trainer._imports import is_available, require

    if not is_available("deepspeed"):
        require("deepspeed", extra="deepspeed", feature="DeepSpeedStrategy")


def _import_deepspeed(accelerator_type: str = "cpu") -> Any:
    """Import DeepSpeed (on the CPU accelerator when asked) and check its version."""
    if accelerator_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read once, at DeepSpeed's import
    from trainer._imports import require
    from trainer.errors import MissingDependencyError

    deepspeed = require("deepspeed", extra="deepspeed", feature="DeepSpeedStrategy")
    version = tuple(int(p) for p in deepspeed.__version__.split("+")[0].split(".")[:3])
    if version < _MIN_VERSION:
        raise MissingDependencyError(
            f"DeepSpeedStrategy needs deepspeed>={'.'.join(map(str, _MIN_VERSION))} "
            f"(managed_gradient_accumulation=false); found {deepspeed.__version__}. Upgrade: "
            "pip install -U 'trainer[deepspeed]'"
        )
    return deepspeed


def _is_partitioned(module: torch.nn.Module) -> bool:
    """Whether ZeRO-3 holds the module's parameters partitioned across ranks."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def _key_prefix(outer: Iterable[str], inner: Iterable[str]) -> str:
    """The prefix that turns ``inner`` keys into ``outer`` ones ("module." when the engine wraps a
    module around the one whose state dict was asked for), or ""."""
    outer_keys, inner_keys = set(outer), list(inner)
    if not inner_keys:
        return ""
    first = inner_keys[0]
    for key in outer_keys:
        prefix = key[: len(key) - len(first)]
        if key.endswith(first) and (not prefix or prefix.endswith(".")):
            if all(prefix + k in outer_keys for k in inner_keys):
                return prefix
    return ""


def load_engine_weights(
    directory: str | os.PathLike[str], info: dict[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """Full weights from a checkpoint's DeepSpeed shards, in this one process.

    ZeRO 1-3: fp32 master weights merged with
    ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``; stage 0: the
    module's weights as saved. Keys are those of the module the Trainer/Accelerator saved.

    Args:
        directory: the checkpoint directory (holding ``deepspeed/``), already verified.
        info: its ``state.json`` ``"deepspeed"`` entry (tag, zero_stage, module_prefix); read
            from the directory when None.

    Raises:
        CheckpointError: the shards cannot be read.
    """
    directory = Path(directory)
    if info is None:
        info = json.loads((directory / "state.json").read_text(encoding="utf-8")).get(STATE_KEY)
    info = info or {}
    tag, prefix = _checked_tag(directory, info), info.get("module_prefix", "")
    engine_dir = directory / ENGINE_DIR
    _import_deepspeed()
    try:
        if int(info.get("zero_stage", 1)) == 0:
            states = engine_dir / tag / "mp_rank_00_model_states.pt"
            saved = _load_engine_file(states)["module"]
        else:
            from deepspeed.utils import zero_to_fp32

            # zero_to_fp32 calls torch.load(weights_only=False) through its module's `torch`
            # name; for this call that name is torch with a weights-only load.
            with (
                _patched(zero_to_fp32, "torch", _WeightsOnlyTorch()),
                contextlib.redirect_stdout(io.StringIO()),  # it prints a line per file
            ):
                saved = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
                    str(engine_dir), tag=tag
                )
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(
            f"{engine_dir}: DeepSpeed's shards could not be read: {err}."
        ) from err
    return {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}


# ---- reading DeepSpeed's files without running code ------------------------------------------
def _engine_safe_globals() -> list[Any]:
    """The classes DeepSpeed's optimizer files pickle besides tensors: data classes and enums."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _load_engine_file(file: str | os.PathLike[str], *, mmap: bool = False) -> Any:
    """One of DeepSpeed's ``*.pt`` files, read with ``weights_only=True`` (never runs code)."""
    from trainer.checkpoint.safe_unpickle import load_weights_only

    return load_weights_only(file, source=file, safe_globals=_engine_safe_globals(), mmap=mmap)


@contextlib.contextmanager
def _weights_only_engine_loads(engine: Any) -> Iterator[None]:
    """``engine.load_checkpoint`` reads every file through ``engine.checkpoint_engine.load``
    (``torch.load(weights_only=False)``); for the duration, that is `_load_engine_file`."""
    checkpoint_engine = engine.checkpoint_engine

    def load(path: str, map_location: Any = None) -> Any:
        return _load_engine_file(path)

    checkpoint_engine.load = load  # an instance attribute shadows the class's method
    try:
        yield
    finally:
        del checkpoint_engine.load


class _WeightsOnlyTorch:
    """``torch`` for DeepSpeed's ``zero_to_fp32`` module: the same, but ``load`` is weights-only."""

    def load(self, file: Any, map_location: Any = None, mmap: bool = False, **_: Any) -> Any:
        return _load_engine_file(file, mmap=mmap)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _checked_tag(directory: Path, info: dict[str, Any] | None) -> str:
    """The DeepSpeed tag from ``state.json``, refused unless it names a folder in ``deepspeed/``."""
    from trainer.checkpoint.paths import resolve_inside

    tag = (info or {}).get("tag", _TAG)
    resolve_inside(directory / ENGINE_DIR, tag, source=directory / "state.json", field="tag")
    return tag
