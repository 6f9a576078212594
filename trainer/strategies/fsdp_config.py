"""Accelerate-style ``fsdp_config`` (dict, YAML or JSON) mapped onto FSDPStrategy arguments.

Accelerate's keys (``fsdp_version``, ``fsdp_auto_wrap_policy``, ``fsdp_transformer_layer_cls_to_wrap``,
``fsdp_reshard_after_forward``, ``fsdp_offload_params`` / ``fsdp_cpu_offload``,
``fsdp_cpu_ram_efficient_loading``, ``fsdp_activation_checkpointing``, ``fsdp_state_dict_type``,
``fsdp_min_num_params``, ``mixed_precision``) are translated; FSDP1-only keys that have no FSDP2
meaning are accepted and listed in ``ignored``; anything else is an error naming the valid keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import ConfigurationError, describe

__all__ = ["FSDP_KEYS", "parse_fsdp_config"]

_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_FSDP1_ONLY = {
    "fsdp_backward_prefetch",
    "fsdp_forward_prefetch",
    "fsdp_sync_module_states",
    "fsdp_use_orig_params",
}
FSDP_KEYS = {
    "fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_reshard_after_forward",
    "fsdp_offload_params", "fsdp_cpu_offload", "fsdp_cpu_ram_efficient_loading", "fsdp_activation_checkpointing",
    "fsdp_state_dict_type", "fsdp_min_num_params", "fsdp_sharding_strategy", "mixed_precision", *_FSDP1_ONLY,
}  # fmt: skip


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigurationError(f"fsdp_config {key}={describe(value)}: expected true or false.")


def _load(config: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    if isinstance(config, dict):
        return dict(config)
    path = Path(config)
    text = path.read_text(encoding="utf-8") if path.is_file() else str(config)
    try:
        if path.suffix == ".json" or text.lstrip().startswith("{"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ValueError as err:
        raise ConfigurationError(f"fsdp_config {config!s}: not valid JSON/YAML: {err}") from err
    if isinstance(data, dict) and isinstance(
        data.get("fsdp_config"), dict
    ):  # a whole launch config
        inner = dict(data["fsdp_config"])
        if "mixed_precision" in data:
            inner.setdefault("mixed_precision", data["mixed_precision"])
        return inner
    if not isinstance(data, dict):
        raise ConfigurationError(f"fsdp_config {config!s}: expected a mapping of fsdp_* keys.")
    return data


def parse_fsdp_config(config: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """FSDPStrategy keyword arguments for an Accelerate ``fsdp_config``.

    Returns a dict of FSDPStrategy arguments plus ``"ignored"`` (FSDP1-only keys) and, when the
    config names one, ``"mixed_precision"`` (Accelerate's name: "no", "fp16", "bf16").

    Examples:
        >>> parse_fsdp_config({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        ...                    "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"})["auto_wrap_policy"]
        {'LlamaDecoderLayer'}
    """
    data = _load(config)
    unknown = sorted(set(data) - FSDP_KEYS)
    if unknown:
        raise ConfigurationError(
            f"fsdp_config: unknown keys {unknown}. Valid keys: {sorted(FSDP_KEYS)}."
        )
    version = int(data.get("fsdp_version", 2))
    if version != 2:
        raise ConfigurationError(
            f"fsdp_config fsdp_version={version}: trainer runs FSDP2 (fully_shard); set fsdp_version: 2."
        )
    out: dict[str, Any] = {"ignored": sorted(_FSDP1_ONLY & set(data))}
    policy = str(data.get("fsdp_auto_wrap_policy", "NO_WRAP")).upper()
    if policy not in _WRAP_POLICIES:
        raise ConfigurationError(
            f"fsdp_config fsdp_auto_wrap_policy={policy!r}: expected one of {_WRAP_POLICIES}."
        )
    if policy == "TRANSFORMER_BASED_WRAP":
        names = data.get("fsdp_transformer_layer_cls_to_wrap")
        if not names:
            raise ConfigurationError(
                "fsdp_config: TRANSFORMER_BASED_WRAP needs fsdp_transformer_layer_cls_to_wrap (class names, comma separated)."
            )
        listed = names if isinstance(names, list) else str(names).split(",")
        out["auto_wrap_policy"] = {name.strip() for name in listed if name.strip()}
    elif policy == "SIZE_BASED_WRAP":
        out["auto_wrap_policy"] = "size"
        out["min_num_params"] = int(float(data.get("fsdp_min_num_params", 1e8)))
    if "fsdp_reshard_after_forward" in data:
        value = data["fsdp_reshard_after_forward"]
        out["reshard_after_forward"] = (
            value.upper() != "SHARD_GRAD_OP"
            if isinstance(value, str) and value.upper() in ("FULL_SHARD", "SHARD_GRAD_OP")
            else _bool("fsdp_reshard_after_forward", value)
        )
    elif "fsdp_sharding_strategy" in data:
        out["reshard_after_forward"] = str(data["fsdp_sharding_strategy"]).upper() not in (
            "SHARD_GRAD_OP",
            "2",
        )
    for key in ("fsdp_offload_params", "fsdp_cpu_offload"):
        if key in data:
            out["cpu_offload"] = _bool(key, data[key])
    for key, name in (
        ("fsdp_cpu_ram_efficient_loading", "cpu_ram_efficient_loading"),
        ("fsdp_activation_checkpointing", "activation_checkpointing"),
    ):
        if key in data:
            out[name] = _bool(key, data[key])
    if "fsdp_state_dict_type" in data:
        kind = str(data["fsdp_state_dict_type"]).upper().replace("_STATE_DICT", "")
        if kind not in ("FULL", "SHARDED"):
            raise ConfigurationError(
                f"fsdp_config fsdp_state_dict_type={data['fsdp_state_dict_type']!r}: expected FULL_STATE_DICT or SHARDED_STATE_DICT."
            )
        out["state_dict_type"] = kind
    if "mixed_precision" in data:
        out["mixed_precision"] = str(data["mixed_precision"]).lower()
    return out
