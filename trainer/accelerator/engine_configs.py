"""The engine plugins and the launch file's engine options, as strategy arguments.

``trainer launch`` passes the launch file's ``fsdp_config`` / ``deepspeed_config`` to the
processes as JSON (``TRAINER_FSDP_CONFIG`` / ``TRAINER_DEEPSPEED_CONFIG``). Here a plugin
becomes those same keys (`fsdp_config_of`), laid over the launched ones, and then the one
parser of each engine turns them into ``FSDPStrategy`` / ``DeepSpeedStrategy`` /
``MegatronStrategy`` arguments (`strategy_options`): the plugin's set fields win, the file fills
the rest, exactly as Accelerate's plugins read its launcher's variables.

Owns the translation only; choosing the strategy is ``engine_setup``'s, running it the
strategy's.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe
from trainer.runtime.engine_plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
)
from trainer.strategies.deepspeed_config import merge_config
from trainer.strategies.fsdp_config import parse_fsdp_config

__all__ = ["EnginePlugin", "fsdp_config_of", "model_parallel_fsdp_options", "strategy_options"]

EnginePlugin = DeepSpeedPlugin | FullyShardedDataParallelPlugin | MegatronLMPlugin

# The launch file's deepspeed_config keys (Accelerate's) and the DeepSpeedPlugin field of each.
_DEEPSPEED_LAUNCH_KEYS = {
    "deepspeed_config_file": "hf_ds_config",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_stage",
    "offload_optimizer_device": "offload_optimizer_device",
    "offload_param_device": "offload_param_device",
    "offload_optimizer_nvme_path": "offload_optimizer_nvme_path",
    "offload_param_nvme_path": "offload_param_nvme_path",
    "zero3_init_flag": "zero3_init_flag",
    "zero3_save_16bit_model": "zero3_save_16bit_model",
    "deepspeed_moe_layer_cls_names": "transformer_moe_cls_names",
}
# Keys of DeepSpeed's own launcher (pdsh and hostfiles); `trainer launch` starts torchrun.
_DEEPSPEED_LAUNCHER_KEYS = {
    "deepspeed_multinode_launcher": (None, "standard"),
    "deepspeed_hostfile": (None, "", "none"),
    "deepspeed_exclusion_filter": (None, "", "none"),
    "deepspeed_inclusion_filter": (None, "", "none"),
}
# fsdp_config keys that state the same setting; the plugin's replaces all of the file's.
_FSDP_SYNONYMS = (
    {"fsdp_offload_params", "fsdp_cpu_offload"},
    {"fsdp_reshard_after_forward", "fsdp_sharding_strategy"},
)
_FSDP_DTYPES = {
    "fp8": torch.bfloat16,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def strategy_options(plugin: EnginePlugin | None) -> tuple[dict[str, Any], int | None]:
    """The strategy's arguments for ``plugin`` and, for DeepSpeed, the accumulation steps it states."""
    if isinstance(plugin, DeepSpeedPlugin):
        return _deepspeed_options(plugin)
    if isinstance(plugin, FullyShardedDataParallelPlugin):
        options: dict[str, Any] = {
            "fsdp_config": _laid_over(
                _launch_options("TRAINER_FSDP_CONFIG"), fsdp_config_of(plugin)
            )
        }
        if plugin.mixed_precision_policy is not None:
            options["mixed_precision_policy"] = _fsdp_mixed_precision(plugin.mixed_precision_policy)
        return options, None
    if isinstance(plugin, MegatronLMPlugin):
        pairs = {
            "tensor_model_parallel_size": plugin.tp_degree,
            "pipeline_model_parallel_size": plugin.pp_degree,
            "sequence_parallel": plugin.sequence_parallelism,
        }
        return {k: v for k, v in pairs.items() if v is not None}, None
    return {}, None


def _launch_options(variable: str) -> dict[str, Any]:
    """The engine options ``trainer launch`` passed in ``variable`` (JSON), else ``{}``."""
    text = os.environ.get(variable)
    return dict(json.loads(text)) if text else {}


# ---- FSDP ----------------------------------------------------------------------------------
def fsdp_config_of(plugin: FullyShardedDataParallelPlugin) -> dict[str, Any]:
    """The plugin's set fields as launch-file ``fsdp_config`` keys (what ``parse_fsdp_config`` reads).

    Examples:
        >>> fsdp_config_of(FullyShardedDataParallelPlugin(cpu_offload=True, state_dict_type="FULL_STATE_DICT"))
        {'fsdp_offload_params': True, 'fsdp_state_dict_type': 'FULL_STATE_DICT'}
    """
    names = plugin.transformer_cls_names_to_wrap or plugin.transformer_layer_cls_to_wrap
    if isinstance(names, list | tuple | set):
        names = ",".join(n if isinstance(n, str) else n.__name__ for n in names)
    keys = {
        "fsdp_version": plugin.fsdp_version,
        "fsdp_sharding_strategy": _enum_name(plugin.sharding_strategy),
        "fsdp_reshard_after_forward": _enum_name(plugin.reshard_after_forward),
        "fsdp_auto_wrap_policy": _wrap_policy_name(plugin.auto_wrap_policy),
        "fsdp_transformer_layer_cls_to_wrap": names,
        "fsdp_min_num_params": plugin.min_num_params,
        "fsdp_offload_params": _is_cpu_offload(plugin.cpu_offload),
        "fsdp_state_dict_type": _enum_name(plugin.state_dict_type),
        "fsdp_cpu_ram_efficient_loading": plugin.cpu_ram_efficient_loading,
        "fsdp_activation_checkpointing": plugin.activation_checkpointing,
        "fsdp_backward_prefetch": _enum_name(plugin.backward_prefetch),
        "fsdp_use_orig_params": plugin.use_orig_params,
        "fsdp_sync_module_states": plugin.sync_module_states,
    }
    return {key: value for key, value in keys.items() if value is not None}


def _laid_over(launched: dict[str, Any], from_plugin: dict[str, Any]) -> dict[str, Any]:
    """The launch file's ``fsdp_config`` with the plugin's keys (and their synonyms) replaced."""
    replaced = set(from_plugin)
    for synonyms in _FSDP_SYNONYMS:
        if synonyms & replaced:
            replaced |= synonyms
    return {**{k: v for k, v in launched.items() if k not in replaced}, **from_plugin}


def _enum_name(value: Any) -> Any:
    """A torch FSDP enum member as its name (the launch file's spelling); other values as given."""
    return value.name if isinstance(value, enum.Enum) else value


def _wrap_policy_name(policy: Any) -> str | None:
    """The launch file's ``fsdp_auto_wrap_policy`` for a plugin's ``auto_wrap_policy``."""
    if policy is None or isinstance(policy, str):
        return policy.upper() if isinstance(policy, str) else None
    from torch.distributed.fsdp.wrap import (
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    if policy is transformer_auto_wrap_policy:
        return "TRANSFORMER_BASED_WRAP"
    if policy is size_based_auto_wrap_policy:
        return "SIZE_BASED_WRAP"
    raise ConfigurationError(
        f"FullyShardedDataParallelPlugin(auto_wrap_policy={describe(policy)}): FSDP2 shards "
        "layers chosen by class name or size. Pass auto_wrap_policy='transformer_based_wrap' "
        "with transformer_cls_names_to_wrap=[...], or 'size_based_wrap' with min_num_params."
    )


def _is_cpu_offload(value: Any) -> bool | None:
    """Whether ``cpu_offload`` (a bool, FSDP2 offload policy or FSDP1 ``CPUOffload``) offloads."""
    if value is None or isinstance(value, bool):
        return value
    if type(value).__name__ in ("CPUOffloadPolicy", "OffloadPolicy"):
        return type(value).__name__ == "CPUOffloadPolicy"
    if isinstance(getattr(value, "offload_params", None), bool):
        return bool(value.offload_params)
    raise ConfigurationError(
        f"FullyShardedDataParallelPlugin(cpu_offload={describe(value)}): expected a bool or a "
        "torch.distributed.fsdp.CPUOffloadPolicy."
    )


def _fsdp_mixed_precision(policy: Any) -> Any:
    """A ``MixedPrecisionPolicy`` for "bf16"/"fp16"/"fp32", a dict of dtypes, or a policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(policy, MixedPrecisionPolicy):
        return policy
    if isinstance(policy, str) and policy.lower() in _FSDP_DTYPES:
        dtype = _FSDP_DTYPES[policy.lower()]
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)
    allowed = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
    if isinstance(policy, dict) and set(policy) <= set(allowed):
        return MixedPrecisionPolicy(
            **{k: _FSDP_DTYPES.get(v, v) if isinstance(v, str) else v for k, v in policy.items()}
        )
    raise ConfigurationError(
        f"FullyShardedDataParallelPlugin(mixed_precision_policy={describe(policy)}): expected "
        f"one of {sorted(_FSDP_DTYPES)}, a dict with keys from {allowed}, or a "
        "torch.distributed.fsdp.MixedPrecisionPolicy (FSDP1's MixedPrecision and buffer_dtype "
        "have no FSDP2 meaning)."
    )


def model_parallel_fsdp_options(plugin: FullyShardedDataParallelPlugin) -> dict[str, Any]:
    """The FSDP plugin as ModelParallelStrategy keywords (the ones it has)."""
    parsed = parse_fsdp_config(fsdp_config_of(plugin))
    parsed.pop("ignored"), parsed.pop("mixed_precision", None)
    options = {
        k: parsed.pop(k)
        for k in ("auto_wrap_policy", "reshard_after_forward", "activation_checkpointing")
        if k in parsed
    }
    if "state_dict_type" in parsed:
        options["save_distributed_checkpoint"] = parsed.pop("state_dict_type") == "SHARDED"
    unsupported = sorted(k for k, v in parsed.items() if v) + (
        ["mixed_precision_policy"] if plugin.mixed_precision_policy is not None else []
    )
    if unsupported:
        raise ConfigurationError(
            f"FullyShardedDataParallelPlugin with a ParallelismConfig: {unsupported} have no "
            "ModelParallelStrategy option (its FSDP takes auto_wrap_policy with layer classes, "
            "reshard_after_forward, activation_checkpointing and state_dict_type). Remove them."
        )
    return options


# ---- DeepSpeed -----------------------------------------------------------------------------
def _deepspeed_options(plugin: DeepSpeedPlugin) -> tuple[dict[str, Any], int | None]:
    """DeepSpeedStrategy's arguments for the plugin laid over the launch file's deepspeed_config."""
    launch = _launch_options("TRAINER_DEEPSPEED_CONFIG")
    for key, allowed in _DEEPSPEED_LAUNCHER_KEYS.items():
        if launch.get(key) not in allowed:
            raise ConfigurationError(
                f"launch config deepspeed_config: {key}={describe(launch[key])} configures "
                "DeepSpeed's own launcher; trainer launch starts torchrun. Remove it (several "
                "machines: num_machines, machine_rank, main_process_ip)."
            )
    from_file = {
        field: launch[key] for key, field in _DEEPSPEED_LAUNCH_KEYS.items() if key in launch
    }
    from_plugin = {
        f.name: getattr(plugin, f.name)
        for f in dataclasses.fields(plugin)
        if getattr(plugin, f.name) is not None and f.name != "is_train_batch_min"
    }
    merged = DeepSpeedPlugin(**{**from_file, **from_plugin})  # checks the file's values too
    inline = {
        k: v
        for k, v in launch.items()
        if k not in _DEEPSPEED_LAUNCH_KEYS and k not in _DEEPSPEED_LAUNCHER_KEYS
    }
    config = merge_config(inline, _read_deepspeed_config(merged.hf_ds_config))
    steps = _stated_once(
        "gradient_accumulation_steps",
        merged.gradient_accumulation_steps,
        config.pop("gradient_accumulation_steps", None),
    )
    clipping = _stated_once(
        "gradient_clipping", merged.gradient_clipping, config.get("gradient_clipping")
    )
    if clipping is not None:
        config["gradient_clipping"] = clipping
    zero = config.setdefault("zero_optimization", {})
    stage = _stated_once("zero_stage", merged.zero_stage, zero.get("stage"))
    if zero.get("stage") == "auto":  # filled by the stage argument
        del zero["stage"]
    if merged.zero3_save_16bit_model is not None:
        zero.setdefault("stage3_gather_16bit_weights_on_model_save", merged.zero3_save_16bit_model)
    if not zero:
        del config["zero_optimization"]
    options: dict[str, Any] = {"config": config}
    if stage is not None:
        options["stage"] = stage
    options.update(_offload_options(merged))
    return options, steps


def _read_deepspeed_config(value: Any) -> dict[str, Any]:
    """``hf_ds_config`` as a dict: a copy of a dict, a JSON file read, ``{}`` for None/"none"."""
    if value is None or value == "none":
        return {}
    if isinstance(value, dict):
        return merge_config({}, value)
    if isinstance(value, str | os.PathLike):
        try:
            with open(value, encoding="utf-8") as file:
                data = json.load(file)
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigurationError(
                f"DeepSpeedPlugin(hf_ds_config={os.fspath(value)!r}): not a readable JSON file "
                f"({err}). Give a DeepSpeed config dict or JSON file path."
            ) from err
        if isinstance(data, dict):
            return data
    raise ConfigurationError(
        f"DeepSpeedPlugin(hf_ds_config={describe(value)}): expected a dict or a JSON file path."
    )


def _stated_once(name: str, from_plugin: Any, from_config: Any) -> Any:
    """The one numeric value of ``name`` between the plugin and the DeepSpeed config, or None."""
    numbers = [
        v
        for v in (from_plugin, from_config)
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    if len(numbers) == 2 and numbers[0] != numbers[1]:
        raise ConfigurationError(
            f"DeepSpeedPlugin: {name} is {from_plugin} in the plugin (or launch file) and "
            f"{from_config} in the DeepSpeed config. State it once, or set the config's to 'auto'."
        )
    return numbers[0] if numbers else None


def _offload_options(plugin: DeepSpeedPlugin) -> dict[str, Any]:
    """DeepSpeedStrategy's offload arguments for the plugin's devices and NVMe paths."""
    options: dict[str, Any] = {}
    paths = set()
    for device, path, flag, argument in (
        (
            plugin.offload_optimizer_device,
            plugin.offload_optimizer_nvme_path,
            "offload_optimizer",
            "offload_optimizer_device",
        ),
        (
            plugin.offload_param_device,
            plugin.offload_param_nvme_path,
            "offload_parameters",
            "offload_params_device",
        ),
    ):
        device = str(device).lower() if device is not None else "none"
        if device != "none":
            options[flag], options[argument] = True, device
        if device == "nvme" and path not in (None, "none"):
            paths.add(path)
    if len(paths) > 1:
        raise ConfigurationError(
            f"DeepSpeedPlugin: offload_optimizer_nvme_path and offload_param_nvme_path differ "
            f"({sorted(paths)}); DeepSpeedStrategy swaps both to one NVMe directory. Give one path."
        )
    if paths:
        options["nvme_path"] = paths.pop()
    return options
