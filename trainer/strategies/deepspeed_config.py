"""The DeepSpeed config: DeepSpeedStrategy's arguments and the user's dict or JSON file, turned
into the dict ``deepspeed.initialize`` receives.

What this file owns: the ``zero_optimization`` section the arguments describe, reading the
user's config and refusing the keys the Trainer/Accelerator own, laying one over the other, and
filling in what the Trainer and Accelerator already know (the precision section, the micro batch
size, clipping, accumulation left to the Accelerator), so the user states each once. It is pure:
dicts in, dicts out, nothing imported from DeepSpeed.

What it does not own: building and driving the engine (``deepspeed.py``), DeepSpeed itself and
the engine wrapper (``deepspeed_engine.py``), and DeepSpeed's checkpoint files
(``deepspeed_checkpoint.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import ConfigurationError, describe

__all__ = [
    "check_logging_batch_size",
    "fill_engine_config",
    "is_positive_int",
    "merge_config",
    "precision_section",
    "read_user_config",
    "to_number",
    "zero_section",
]

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


def zero_section(
    stage: int, offload_optimizer: str | bool, offload_param: str | bool, nvme_path: str | None,
    *, pin_memory: bool, **options: Any,
) -> dict[str, Any]:  # fmt: skip
    """The ``zero_optimization`` section the arguments describe, checked at construction.

    ``offload_optimizer`` / ``offload_param`` are the device ("cpu", "nvme") or False when off;
    ``options`` are the section's remaining keys (``overlap_comm``, bucket sizes...).

    Raises:
        ConfigurationError: a stage outside 0-3, an offload device other than "cpu"/"nvme",
            "nvme" without ``nvme_path``, or an offload the stage cannot do.
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


def read_user_config(config: dict[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any]:
    """The user's config as a dict (a JSON file is read), with the keys the Trainer owns refused.

    ``None`` is the JSON ``trainer launch`` passes in ``TRAINER_DEEPSPEED_CONFIG``, else ``{}``.

    Raises:
        ConfigurationError: the file is missing or not JSON, the config is not a dict, or it
            sets a key the Trainer/Accelerator own (naming where to state it instead).
    """
    if config is None and os.environ.get("TRAINER_DEEPSPEED_CONFIG"):
        config = json.loads(os.environ["TRAINER_DEEPSPEED_CONFIG"])  # from `trainer launch`
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


def check_logging_batch_size(value: int | str) -> int | str:
    """``logging_batch_size_per_gpu`` as given: "auto" or a positive int.

    Raises:
        ConfigurationError: any other value.
    """
    if value != "auto" and not is_positive_int(value):
        raise ConfigurationError(
            f"DeepSpeedStrategy(logging_batch_size_per_gpu={describe(value)}): expected 'auto' "
            "or a positive int."
        )
    return value


def merge_config(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, nested dicts merged key by key (copies, inputs kept)."""
    merged = {k: merge_config({}, v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = merge_config({}, value) if isinstance(value, dict) else value
    return merged


def precision_section(precision_name: str, accelerator_type: str) -> str | None:
    """The config section ("fp16", "bf16") a precision enables; None for 32-true.

    Raises:
        ConfigurationError: the precision has no DeepSpeed mode, or is fp16 on CPU.
    """
    if precision_name not in _PRECISION_SECTIONS:
        raise ConfigurationError(
            f"DeepSpeedStrategy: precision={precision_name!r} has no DeepSpeed mode. Expected one "
            f"of {sorted(_PRECISION_SECTIONS)}."
        )
    section = _PRECISION_SECTIONS[precision_name]
    if section == "fp16" and accelerator_type == "cpu":
        raise ConfigurationError(
            f"DeepSpeedStrategy: precision={precision_name!r} needs a GPU (DeepSpeed refuses fp16 "
            "on CPU). Use precision='bf16-mixed' on CPU."
        )
    return section


def fill_engine_config(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    gradient_clipping: float,
    precision_name: str,
    accelerator_type: str,
    loss_scaling: dict[str, Any],
) -> dict[str, Any]:
    """A copy of ``config`` completed for ``deepspeed.initialize``.

    Accumulation is the Accelerator's (``gradient_accumulation_steps=1``,
    ``managed_gradient_accumulation=false``), the precision section follows ``precision_name``
    (fp16 starting from ``loss_scaling``), and "auto" values nobody filled are left out.

    Raises:
        ConfigurationError: the precision has no DeepSpeed mode, or the config's ``fp16`` /
            ``bf16`` section disagrees with it.
    """
    config = merge_config({}, config)
    config["train_micro_batch_size_per_gpu"] = micro_batch_size
    config["gradient_accumulation_steps"] = 1
    config["managed_gradient_accumulation"] = False
    config["gradient_clipping"] = gradient_clipping
    config.setdefault("steps_per_print", 2**31 - 1)
    config.setdefault("wall_clock_breakdown", False)
    zero = config.get("zero_optimization", {})
    if zero.get("offload_optimizer", {}).get("device", "none") != "none":
        # The optimizer is the user's torch optimizer, not DeepSpeedCPUAdam (compiled on use).
        config.setdefault("zero_force_ds_cpu_optimizer", False)
    section = precision_section(precision_name, accelerator_type)
    for name in ("fp16", "bf16"):
        stated = config.get(name, {}).get("enabled")
        if stated not in (None, "auto") and bool(stated) != (name == section):
            raise ConfigurationError(
                f"DeepSpeedStrategy(config={{'{name}': {{'enabled': {stated}}}}}) disagrees "
                f"with precision={precision_name!r}. State the precision once: drop "
                f"'{name}' from the config and set Trainer(precision=...) / "
                "Accelerator(mixed_precision=...)."
            )
        if name != section:
            config.pop(name, None)
    if section == "fp16":
        config["fp16"] = {**loss_scaling, **config.get("fp16", {}), "enabled": True}
    elif section == "bf16":
        config["bf16"] = {**config.get("bf16", {}), "enabled": True}
    return _drop_auto(config)


def _drop_auto(config: dict[str, Any]) -> dict[str, Any]:
    """Leave out the "auto" values nobody filled, so DeepSpeed uses its defaults for them."""
    return {
        k: _drop_auto(v) if isinstance(v, dict) else v for k, v in config.items() if v != "auto"
    }


def to_number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool), else None ("auto", unset)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def is_positive_int(value: Any) -> bool:
    """Whether ``value`` is an int (not a bool) above 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
