"""Accelerate's kwargs handlers: options for the torch objects an Accelerator creates.

One dataclass per object, with Accelerate 1.15's names and defaults:

- `DistributedDataParallelKwargs` -> ``torch.nn.parallel.DistributedDataParallel`` (and its
  gradient communication hook, `DDPCommunicationHookType`);
- `GradScalerKwargs` -> ``torch.amp.GradScaler`` (fp16 loss scaling);
- `InitProcessGroupKwargs` -> ``torch.distributed.init_process_group`` (backend, timeout);
- `AutocastKwargs` -> ``torch.autocast`` (the mixed-precision forward);
- `ProfileKwargs` -> ``torch.profiler.profile`` (``Accelerator.profile()``);
- `AORecipeKwargs`, `TERecipeKwargs`, `FP8RecipeKwargs` -> the fp8 precision plugin's recipe.

This module owns the options and their checks; ``trainer.accelerator.engine_setup`` hands
them to the strategy and the precision plugin. Unlike Accelerate's, these classes read no
environment variable: a default is the default. Nothing here imports an optional package.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "ProfileKwargs",
    "TERecipeKwargs",
]

_PROFILER_ACTIVITIES = ("cpu", "cuda", "xpu", "mtia", "hpu")
_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
_AMAX_ALGORITHMS = ("max", "most_recent")


class KwargsHandler:
    """The base of every handler: ``to_kwargs()`` is what differs from the class's defaults."""

    def to_dict(self) -> dict[str, Any]:
        """Every field and its value."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]  # subclasses are dataclasses

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from a default instance's (Accelerate's rule).

        Examples:
            >>> GradScalerKwargs(init_scale=1024.0).to_kwargs()
            {'init_scale': 1024.0}
        """
        defaults = type(self)().to_dict()
        return {k: v for k, v in self.to_dict().items() if defaults[k] != v}


def _choice(owner: str, name: str, value: Any, choices: tuple[str, ...], *, upper: bool) -> str:
    """``value`` normalised to one of ``choices``, or a ConfigurationError listing them."""
    text = str(getattr(value, "value", value))
    text = text.upper() if upper else text.lower()
    if text not in choices:
        raise ConfigurationError(
            f"{owner}({name}={describe(value)}): expected one of {', '.join(map(repr, choices))}."
        )
    return text


@dataclass
class AutocastKwargs(KwargsHandler):
    """How ``torch.autocast`` runs the forward pass under ``mixed_precision="fp16"/"bf16"/"fp8"``.

    Args:
        enabled: False runs the prepared model's forward (and ``accelerator.autocast()``) in
            full precision.
        cache_enabled: ``torch.autocast``'s weight-cast cache (None: torch's default).

    Examples:
        >>> accelerator = Accelerator(mixed_precision="bf16",
        ...                           kwargs_handlers=[AutocastKwargs(cache_enabled=False)])
    """

    enabled: bool = True
    cache_enabled: bool | None = None


class DDPCommunicationHookType(str, enum.Enum):
    """The gradient communication hooks `DistributedDataParallelKwargs` can register."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self) -> str:
        return self.value


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments of the ``DistributedDataParallel`` that wraps each prepared model.

    They reach DDP under the ``ddp`` strategy (and MegatronStrategy's data-parallel DDP); the
    other engines do not wrap with DDP and ignore them, as in Accelerate.

    Args:
        dim: DDP's scatter dimension; only 0 (one device per process).
        broadcast_buffers: broadcast buffers from rank 0 at every forward.
        bucket_cap_mb: the gradient bucket size in MiB.
        find_unused_parameters: allow parameters that get no gradient in a step.
        check_reduction: deprecated in torch; only False.
        gradient_as_bucket_view: gradients are views into the communication buckets.
        static_graph: the set of used parameters never changes between steps.
        comm_hook: compress gradients for the all-reduce (fp16, bf16, PowerSGD).
        comm_wrapper: fp16/bf16 compression around the PowerSGD hooks.
        comm_state_option: keyword arguments of ``PowerSGDState``.

    Examples:
        >>> kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)
        >>> accelerator = Accelerator(kwargs_handlers=[kwargs])  # under `trainer launch`
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = "DistributedDataParallelKwargs"
        hooks = tuple(member.value for member in DDPCommunicationHookType)
        self.comm_hook = DDPCommunicationHookType(
            _choice(owner, "comm_hook", self.comm_hook, hooks, upper=False)
        )
        self.comm_wrapper = DDPCommunicationHookType(
            _choice(owner, "comm_wrapper", self.comm_wrapper, ("no", "fp16", "bf16"), upper=False)
        )
        for name, fixed in (("dim", 0), ("check_reduction", False)):
            if getattr(self, name) != fixed:
                raise ConfigurationError(
                    f"{owner}({name}={describe(getattr(self, name))}): every process drives one "
                    f"device, so DDP's {name} has no use here. Leave it at {fixed!r}."
                )

    def to_dict(self) -> dict[str, Any]:
        """The DistributedDataParallel arguments (the hook fields are not among them)."""
        hook_fields = ("comm_hook", "comm_wrapper", "comm_state_option")
        return {k: v for k, v in super().to_dict().items() if k not in hook_fields}


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments of the ``torch.amp.GradScaler`` that ``mixed_precision="fp16"`` creates.

    Other precisions do not scale the loss and ignore them, as in Accelerate (DeepSpeed scales
    fp16 losses itself: set its ``fp16`` config section instead).

    Examples:
        >>> accelerator = Accelerator(mixed_precision="fp16",
        ...                           kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """How the strategy creates the process group: ``init_process_group(backend, timeout=...)``.

    As in Accelerate only what differs from the defaults is applied, so the default
    ``backend="nccl"`` means "the strategy's choice" (nccl on GPUs, gloo on CPUs).

    Args:
        backend: "nccl", "gloo" (or another torch.distributed backend).
        init_method: only None / "env://": the launcher's rendezvous.
        timeout: how long a collective may wait; None gives 1800 s (600 s with nccl).

    Examples:
        >>> kwargs = InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=120))
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: dt.timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is None:
            self.timeout = dt.timedelta(seconds=1800 if self.backend != "nccl" else 600)
        if not isinstance(self.timeout, dt.timedelta):
            raise ConfigurationError(
                f"InitProcessGroupKwargs(timeout={describe(self.timeout)}): expected a "
                "datetime.timedelta."
            )
        if self.init_method not in (None, "env://"):
            raise ConfigurationError(
                f"InitProcessGroupKwargs(init_method={self.init_method!r}): processes meet "
                "through the launcher's environment (torchrun, SLURM). Leave init_method None."
            )


@dataclass
class ProfileKwargs(KwargsHandler):
    """What ``accelerator.profile()`` records with ``torch.profiler.profile``.

    Args:
        activities: "cpu", "cuda", "xpu", "mtia", "hpu" (None: torch's default).
        schedule_option: ``torch.profiler.schedule`` arguments (wait, warmup, active, repeat,
            skip_first); call ``prof.step()`` once per step.
        on_trace_ready: called with the profiler when a scheduled trace is ready.
        record_shapes: as in ``torch.profiler.profile``.
        profile_memory: as in ``torch.profiler.profile``.
        with_stack: as in ``torch.profiler.profile``.
        with_flops: as in ``torch.profiler.profile``.
        with_modules: as in ``torch.profiler.profile``.
        output_trace_dir: write ``profile_<process_index>.json`` (a Chrome trace) here.

    Examples:
        >>> accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir="trace")])
        >>> with accelerator.profile() as prof:
        ...     model(x)
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def __post_init__(self) -> None:
        if self.activities is not None:
            self.activities = [
                _choice("ProfileKwargs", "activities", a, _PROFILER_ACTIVITIES, upper=False)
                for a in self.activities
            ]

    def build(self) -> torch.profiler.profile:
        """A ``torch.profiler.profile`` with these options (not started).

        Raises:
            ConfigurationError: an activity this torch build cannot record.
        """
        activities = None
        if self.activities is not None:
            activities = []
            for name in self.activities:
                activity = getattr(torch.profiler.ProfilerActivity, name.upper(), None)
                if activity is None:
                    raise ConfigurationError(
                        f"ProfileKwargs(activities=[..., {name!r}]): this torch build has no "
                        f"{name} profiler. Record 'cpu' and the device you train on."
                    )
                activities.append(activity)
        schedule = None
        if self.schedule_option is not None:
            schedule = torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@dataclass
class AORecipeKwargs(KwargsHandler):
    """The torchao fp8 recipe for ``mixed_precision="fp8"`` (``FP8Precision(backend="torchao")``).

    Args:
        config: a ``torchao.float8.Float8LinearConfig``; None builds one from the two flags.
        module_filter_func: ``fn(module, fqn) -> bool``; False keeps a layer in high precision.
        pad_inner_dim: torchao pads matmul dims to multiples of 16 (None: True).
        enable_fsdp_float8_all_gather: FSDP2 gathers fp8 weights (None: True).
    """

    config: Any = None
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None


@dataclass
class TERecipeKwargs(KwargsHandler):
    """The TransformerEngine fp8 recipe for ``mixed_precision="fp8"``.

    Fields are ``transformer_engine.common.recipe.DelayedScaling``'s (``MXFP8BlockScaling``'s
    with ``use_mxfp8_block_scaling``); as in Accelerate only those that differ from these
    defaults are passed, the others keep TransformerEngine's defaults.

    Args:
        use_autocast_during_eval: fp8 also in eval mode (here the fp8 region always runs).
        margin: scaling-factor margin.
        interval: steps between scaling-factor updates.
        amax_history_len: how many amax values the scaling factor looks back on.
        fp8_format: "HYBRID", "E4M3" or "E5M2".
        amax_compute_algo: "max" or "most_recent".
        override_linear_precision: run (fprop, dgrad, wgrad) in higher precision.
        use_mxfp8_block_scaling: MXFP8 block scaling instead of delayed scaling.
    """

    use_autocast_during_eval: bool = False
    margin: int = 0
    interval: int = 1
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "most_recent"
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    use_mxfp8_block_scaling: bool = False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        self.fp8_format = _choice(owner, "fp8_format", self.fp8_format, _FP8_FORMATS, upper=True)
        self.amax_compute_algo = _choice(
            owner, "amax_compute_algo", self.amax_compute_algo, _AMAX_ALGORITHMS, upper=False
        )


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Accelerate's older fp8 handler: a TransformerEngine recipe plus the backend's name.

    Args:
        backend: "TE" (TransformerEngine; None means "TE"). "MSAMP" is refused: MS-AMP has no
            backend here. For torchao use `AORecipeKwargs`.
        opt_level: MS-AMP's level; unused.
    """

    backend: str | None = None
    opt_level: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.backend = "TE" if self.backend is None else str(self.backend).upper()
        if self.backend != "TE":
            raise ConfigurationError(
                f"FP8RecipeKwargs(backend={self.backend!r}): the fp8 backends here are "
                "TransformerEngine (backend='TE') and torchao (AORecipeKwargs); MS-AMP is not "
                "one. Use FP8RecipeKwargs(backend='TE') or AORecipeKwargs()."
            )
