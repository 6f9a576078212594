"""Accelerate's engine plugins: the options of the DeepSpeed, FSDP, Megatron and compile engines.

`DeepSpeedPlugin`, `FullyShardedDataParallelPlugin`, `MegatronLMPlugin` and
`TorchDynamoPlugin`, with Accelerate 1.15's field names. A field left None is not set by the
plugin: under ``trainer launch`` the launch file's ``deepspeed_config`` / ``fsdp_config`` fills
it, else the engine's default applies (Accelerate's plugins read its launcher's environment
variables the same way).

This module owns the options and the checks that need no other layer: values out of range, and
options whose feature this package does not have (each refused with the fix, never ignored).
It does not build anything: ``trainer.accelerator.engine_setup`` turns a plugin into the
existing Strategy (``DeepSpeedStrategy``, ``FSDPStrategy``, ``MegatronStrategy``) or into
``torch.compile`` options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe

__all__ = [
    "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin",
    "MegatronLMPlugin",
    "TorchDynamoPlugin",
]

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _refuse_set(owner: str, values: dict[str, Any], fix: str) -> None:
    """Raise for the first option in ``values`` that is set (not None/False)."""
    for name, value in values.items():
        if value not in (None, False):
            raise ConfigurationError(f"{owner}({name}={describe(value)}) is not supported: {fix}")


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed ZeRO options; the Accelerator runs them with ``DeepSpeedStrategy``.

    Args:
        hf_ds_config: a DeepSpeed config (dict or JSON file path); the fields below fill its
            "auto" and missing values. ``optimizer`` and ``scheduler`` sections are refused:
            prepare your own torch optimizer and scheduler.
        gradient_accumulation_steps: batches per optimizer step; becomes the Accelerator's
            ``gradient_accumulation_steps`` ("auto": the Accelerator's).
        gradient_clipping: the 2-norm DeepSpeed clips to at every step ("auto"/None: none).
        zero_stage: 0, 1, 2 or 3 (None: 2).
        is_train_batch_min: kept for Accelerate's scripts; the train loader's batch size is
            ``train_micro_batch_size_per_gpu`` either way.
        offload_optimizer_device: "none", "cpu" or "nvme" (ZeRO 1-3).
        offload_param_device: "none", "cpu" or "nvme" (ZeRO 3).
        offload_optimizer_nvme_path: the NVMe directory for the optimizer offload.
        offload_param_nvme_path: the NVMe directory for the parameter offload (the same one).
        zero3_init_flag: kept for Accelerate's scripts: only transformers' ``from_pretrained``
            builds models under ``deepspeed.zero.Init``, here as in Accelerate.
        zero3_save_16bit_model: ``stage3_gather_16bit_weights_on_model_save`` in the config.
        transformer_moe_cls_names: refused (no ZeRO-3 MoE leaf modules here).
        enable_msamp: refused (no MS-AMP backend).
        msamp_opt_level: unused without MS-AMP.

    Examples:
        >>> plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu")
        >>> accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision="bf16")
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        owner = "DeepSpeedPlugin"
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ConfigurationError(
                f"{owner}(zero_stage={describe(self.zero_stage)}): expected 0, 1, 2 or 3."
            )
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value is not None and str(value).lower() not in _OFFLOAD_DEVICES:
                raise ConfigurationError(
                    f"{owner}({name}={describe(value)}): expected one of {_OFFLOAD_DEVICES}."
                )
        steps = self.gradient_accumulation_steps
        if steps not in (None, "auto") and not (
            isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
        ):
            raise ConfigurationError(
                f"{owner}(gradient_accumulation_steps={describe(steps)}): expected an int >= 1 "
                "or 'auto'."
            )
        clip = self.gradient_clipping
        if clip not in (None, "auto") and (
            not isinstance(clip, int | float) or isinstance(clip, bool) or clip < 0
        ):
            raise ConfigurationError(
                f"{owner}(gradient_clipping={describe(clip)}): expected a number >= 0 or 'auto'."
            )
        _refuse_set(
            owner,
            {"enable_msamp": self.enable_msamp},
            "MS-AMP is not an fp8 backend here. Use mixed_precision='fp8' (torchao or "
            "TransformerEngine) or bf16.",
        )
        _refuse_set(
            owner,
            {"transformer_moe_cls_names": self.transformer_moe_cls_names},
            "DeepSpeedStrategy does not mark ZeRO-3 leaf modules. Remove it; for a mixture of "
            "experts call deepspeed.utils.set_z3_leaf_modules(model, [...]) before prepare.",
        )


@dataclass
class FullyShardedDataParallelPlugin:
    """FSDP options; the Accelerator runs them with ``FSDPStrategy`` (FSDP2, ``fully_shard``).

    The fields mirror the launch file's ``fsdp_config`` keys without their ``fsdp_`` prefix
    (``transformer_cls_names_to_wrap`` is ``fsdp_transformer_layer_cls_to_wrap``).

    Args:
        fsdp_version: 2 (None: 2). FSDP1 is refused: trainer runs FSDP2 only.
        reshard_after_forward: True frees gathered parameters after forward (FULL_SHARD),
            False keeps them for backward (SHARD_GRAD_OP); the strings are accepted too.
        sharding_strategy: FSDP1's spelling of the same ("FULL_SHARD", "SHARD_GRAD_OP").
        mixed_precision_policy: FSDP's own casting: "bf16"/"fp16"/"fp32", a dict of
            ``param_dtype``/``reduce_dtype``/``output_dtype``, or a
            ``torch.distributed.fsdp.MixedPrecisionPolicy`` (None: from ``mixed_precision``).
        auto_wrap_policy: "transformer_based_wrap" (the classes named in
            ``transformer_cls_names_to_wrap``), "size_based_wrap" (``min_num_params``),
            "no_wrap", or torch's ``transformer_auto_wrap_policy`` / ``size_based_auto_wrap_policy``.
        cpu_offload: keep parameters, gradients and optimizer states on the CPU (a bool or a
            ``CPUOffloadPolicy``).
        state_dict_type: "SHARDED_STATE_DICT" (None) or "FULL_STATE_DICT".
        cpu_ram_efficient_loading: only rank 0 holds the weights; the others receive them.
        activation_checkpointing: recompute the wrapped layers' activations in backward.
        transformer_cls_names_to_wrap: layer class names (a list or "A,B").
        transformer_layer_cls_to_wrap: the launch file's name for the same list.
        min_num_params: the size threshold of "size_based_wrap".
        backward_prefetch: an FSDP1 option with no FSDP2 meaning (accepted, as by Accelerate's
            FSDP2).
        forward_prefetch: FSDP1 only; ``True`` is refused, as by Accelerate's FSDP2.
        use_orig_params: FSDP1 only (accepted).
        sync_module_states: FSDP1 only (accepted).
        limit_all_gathers: FSDP1 only (accepted).
        ignored_modules: refused when set.
        param_init_fn: refused when set.
        state_dict_config: refused when set.
        optim_state_dict_config: refused when set.
        activation_checkpointing_offload: refused when set.

    Examples:
        >>> plugin = FullyShardedDataParallelPlugin(
        ...     auto_wrap_policy="transformer_based_wrap",
        ...     transformer_cls_names_to_wrap=["Block"], state_dict_type="FULL_STATE_DICT")
        >>> accelerator = Accelerator(fsdp_plugin=plugin)  # under `trainer launch`
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: bool | str | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: str | Callable[..., Any] | None = None
    cpu_offload: Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    transformer_layer_cls_to_wrap: list[str] | str | None = None

    def __post_init__(self) -> None:
        owner = "FullyShardedDataParallelPlugin"
        if self.fsdp_version not in (None, 2):
            raise ConfigurationError(
                f"{owner}(fsdp_version={describe(self.fsdp_version)}): trainer runs FSDP2 "
                "(fully_shard) only. Set fsdp_version=2; FSDP1's options map onto it (see the "
                "Accelerate migration guide)."
            )
        _refuse_set(
            owner,
            {"forward_prefetch": self.forward_prefetch},
            "FSDP2 has no forward prefetch (Accelerate refuses it with FSDP2 too). Remove it.",
        )
        _refuse_set(
            owner,
            {
                "ignored_modules": self.ignored_modules,
                "param_init_fn": self.param_init_fn,
                "state_dict_config": self.state_dict_config,
                "optim_state_dict_config": self.optim_state_dict_config,
                "activation_checkpointing_offload": self.activation_checkpointing_offload,
            },
            "FSDPStrategy has no such option. Remove it (state_dict_type chooses FULL or "
            "SHARDED checkpoints; cpu_ram_efficient_loading initialises from rank 0).",
        )
        names, alias = self.transformer_cls_names_to_wrap, self.transformer_layer_cls_to_wrap
        if names is not None and alias is not None and names != alias:
            raise ConfigurationError(
                f"{owner}: transformer_cls_names_to_wrap={names!r} and "
                f"transformer_layer_cls_to_wrap={alias!r} name the same list. Pass one."
            )


@dataclass
class MegatronLMPlugin:
    """megatron.core parallelism; the Accelerator runs it with ``MegatronStrategy``.

    Args:
        tp_degree: processes that split each megatron layer (tensor parallelism; None: 1).
        pp_degree: pipeline stages (CUDA only; None: 1).
        num_micro_batches: only 1 (None): with pipeline stages you run megatron's schedule
            (``get_forward_backward_func``) and pass it the micro-batch count.
        gradient_clipping: refused: call ``accelerator.clip_grad_norm_`` (tensor-parallel aware).
        sequence_parallelism: split activations along the sequence between tensor-parallel
            peers (CUDA only).
        recompute_activations: refused (no such MegatronStrategy option).
        use_distributed_optimizer: refused (no such MegatronStrategy option).

    Examples:
        >>> accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    """

    tp_degree: int | None = None
    pp_degree: int | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None

    def __post_init__(self) -> None:
        owner = "MegatronLMPlugin"
        for name in ("tp_degree", "pp_degree"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ConfigurationError(
                    f"{owner}({name}={describe(value)}): expected an int >= 1."
                )
        if self.num_micro_batches not in (None, 1):
            raise ConfigurationError(
                f"{owner}(num_micro_batches={describe(self.num_micro_batches)}): MegatronStrategy "
                "runs your step; with pipeline stages pass num_microbatches to megatron's "
                "get_forward_backward_func() in it. Remove num_micro_batches."
            )
        _refuse_set(
            owner,
            {"gradient_clipping": self.gradient_clipping},
            "clip in the loop with accelerator.clip_grad_norm_(model.parameters(), max_norm), "
            "which MegatronStrategy makes tensor-parallel aware.",
        )
        _refuse_set(
            owner,
            {
                "recompute_activations": self.recompute_activations,
                "use_distributed_optimizer": self.use_distributed_optimizer,
            },
            "MegatronStrategy has no such option. Remove it (recompute inside your megatron "
            "layers with their config's recompute_granularity).",
        )


@dataclass
class TorchDynamoPlugin:
    """``torch.compile`` options for every prepared model.

    Args:
        backend: a torch.compile backend ("inductor", "aot_eager", ...); None or "no": no
            compilation (Accelerate's default).
        mode: "default", "reduce-overhead", "max-autotune" (None: torch's default).
        fullgraph: fail instead of breaking the graph.
        dynamic: trace with dynamic shapes (None: torch decides).
        options: backend options (not together with ``mode``).
        disable: compile as a no-op (for tests).
        use_regional_compilation: refused: the whole model is compiled.

    Examples:
        >>> accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor",
        ...                                                          mode="max-autotune"))
    """

    backend: str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        owner = "TorchDynamoPlugin"
        if self.backend is not None:
            self.backend = str(getattr(self.backend, "value", self.backend)).lower()
        if self.mode not in (None, "default") and self.options:
            raise ConfigurationError(
                f"{owner}(mode={self.mode!r}, options={describe(self.options)}): torch.compile "
                "takes one of them. Put the mode's settings into options, or drop options."
            )
        _refuse_set(
            owner,
            {"use_regional_compilation": self.use_regional_compilation},
            "prepare compiles the whole model. Remove it, or compile the repeated blocks "
            "yourself before prepare (block.compile()).",
        )

    @property
    def is_enabled(self) -> bool:
        """Whether prepared models are compiled (a backend other than "no" is set)."""
        return self.backend not in (None, "no")

    def compile_kwargs(self) -> dict[str, Any]:
        """The ``torch.compile`` keyword arguments (only the ones set).

        Examples:
            >>> TorchDynamoPlugin(backend="aot_eager", fullgraph=True).compile_kwargs()
            {'backend': 'aot_eager', 'fullgraph': True}
        """
        kwargs: dict[str, Any] = {"backend": self.backend}
        if self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        for name in ("fullgraph", "dynamic", "options"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if self.disable:
            kwargs["disable"] = True
        return kwargs
