"""The launch configuration: Accelerate's ``default_config.yaml`` shape, read, checked, written.

``trainer launch`` reads it (``--config_file`` or the default location), ``trainer config``
writes it. The default location is ``$XDG_CACHE_HOME/trainer/default_config.yaml`` (else
``~/.cache/trainer/default_config.yaml``). Only the keys listed in ``LaunchConfig`` mean
something; an unknown key is an error naming the valid ones.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.errors import ConfigurationError, describe

__all__ = [
    "DISTRIBUTED_TYPES",
    "LaunchConfig",
    "default_config_path",
    "load_launch_config",
    "write_launch_config",
]

DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")
_STRATEGY_OF = {
    "NO": "single",
    "MULTI_CPU": "ddp",
    "MULTI_GPU": "ddp",
    "FSDP": "fsdp",
    "DEEPSPEED": "deepspeed",
    "MEGATRON_LM": "megatron",
    "XLA": "xla",
}
_PRECISIONS = ("no", "fp16", "bf16", "fp8")


@dataclass
class LaunchConfig:
    """What ``trainer launch`` needs to start a job; field names are Accelerate's."""

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    mixed_precision: str = "no"
    num_machines: int = 1
    num_processes: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    same_network: bool = True
    use_cpu: bool = False
    debug: bool = False
    gpu_ids: str = "all"
    main_training_function: str = "main"
    downcast_bf16: str = "no"
    enable_cpu_affinity: bool = False
    tpu_env: list[Any] = field(default_factory=list)
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    fsdp_config: dict[str, Any] = field(default_factory=dict)
    deepspeed_config: dict[str, Any] = field(default_factory=dict)
    megatron_lm_config: dict[str, Any] = field(default_factory=dict)
    dynamo_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.distributed_type = str(self.distributed_type).upper()
        if self.distributed_type not in DISTRIBUTED_TYPES:
            raise ConfigurationError(
                f"launch config distributed_type={self.distributed_type!r}: expected one of {DISTRIBUTED_TYPES}."
            )
        self.mixed_precision = str(self.mixed_precision).lower()
        if self.mixed_precision not in _PRECISIONS:
            raise ConfigurationError(
                f"launch config mixed_precision={self.mixed_precision!r}: expected one of {_PRECISIONS}."
            )
        for name in ("num_machines", "num_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"launch config {name}={describe(value)}: expected an int >= 1."
                )
        if self.num_machines > 1 and not self.main_process_ip:
            raise ConfigurationError(
                "launch config: num_machines > 1 needs main_process_ip (the address of machine_rank 0)."
            )

    @property
    def strategy(self) -> str:
        """The trainer strategy name the distributed type maps to."""
        return _STRATEGY_OF[self.distributed_type]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_config_path() -> Path:
    """``$XDG_CACHE_HOME/trainer/default_config.yaml``, else under ``~/.cache``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "trainer" / "default_config.yaml"


def load_launch_config(path: str | os.PathLike[str] | None = None) -> LaunchConfig:
    """Read ``path`` (or the default file if it exists; else defaults) into a LaunchConfig."""
    import yaml

    file = Path(path) if path is not None else default_config_path()
    if not file.is_file():
        if path is not None:
            raise ConfigurationError(
                f"launch config file {file} does not exist. Write one with `trainer config --config_file {file}`."
            )
        return LaunchConfig()
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigurationError(
            f"launch config file {file} is not readable YAML: {err}".replace("\n", " ")
        ) from err
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"launch config file {file}: expected a mapping of keys, found {type(data).__name__}."
        )
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigurationError(
            f"launch config file {file}: unknown keys {unknown}. Valid keys: {sorted(known)}."
        )
    return LaunchConfig(**data)


def write_launch_config(config: LaunchConfig, path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``config`` as YAML to ``path`` (default location when None); return the path."""
    import yaml

    file = Path(path) if path is not None else default_config_path()
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    return file
