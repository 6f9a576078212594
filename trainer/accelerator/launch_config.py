"""The launch configuration: Accelerate's ``default_config.yaml`` shape, read, checked, written.

``trainer launch`` reads it (``--config_file`` or the default location), ``trainer config``
writes it. The default location is ``$XDG_CACHE_HOME/trainer/default_config.yaml`` (else
``~/.cache/trainer/default_config.yaml``).

``num_processes`` has Accelerate's meaning: the total over all ``num_machines`` machines (each
machine runs ``num_processes / num_machines``, `LaunchConfig.processes_per_machine`), so a file
written by ``accelerate config`` starts the same world size under ``trainer launch`` as under
``accelerate launch``. Every key is acted on or refused. The process layout becomes torchrun's command line and the
rest becomes environment variables the launched processes read (``launchers``). The keys that
Accelerate writes for features trainer does not have (SageMaker, TPU pods, CPU affinity, its
debug mode, ``megatron_lm_config``, ``dynamo_config``) are accepted only with the value that
means "off". Any other value is a ConfigurationError naming the key, the file and what to write
instead; an unknown key is one naming the valid keys. Engine names come from the strategy
registry (``trainer.strategies``). This module does not start processes (``launchers`` does).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from trainer.errors import ConfigurationError, describe
from trainer.strategies import STRATEGY_REGISTRY, distributed_type_strategies

__all__ = [
    "DISTRIBUTED_TYPES",
    "LaunchConfig",
    "default_config_path",
    "load_launch_config",
    "write_launch_config",
]

_STRATEGY_OF = distributed_type_strategies()
DISTRIBUTED_TYPES = tuple(_STRATEGY_OF)
_PRECISIONS = ("no", "fp16", "bf16", "fp8")
# Keys Accelerate writes for features `trainer launch` does not have. Accelerate writes the "off"
# values into every file, so they are accepted; any other value is refused with the fix.
_OFF_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "compute_environment": (
        ("LOCAL_MACHINE",),
        "trainer launch starts processes on this machine, or on num_machines machines through "
        "torchrun; it has no SageMaker launcher. Write compute_environment: LOCAL_MACHINE.",
    ),
    "debug": (
        (False, None),
        "Accelerate's debug mode (shape checks in its collectives) has no trainer counterpart. "
        "Write debug: false; for torch.distributed's own checks set TORCH_DISTRIBUTED_DEBUG=DETAIL.",
    ),
    "downcast_bf16": (
        ("no", False, None),
        "it is a TPU option of Accelerate's launcher; here the precision plugin sets dtypes. "
        "Write downcast_bf16: 'no' and choose mixed_precision: bf16.",
    ),
    "enable_cpu_affinity": (
        (False, None),
        "trainer launch does not pin processes to the CPUs near their GPU. "
        "Write enable_cpu_affinity: false (or bind with numactl around the command).",
    ),
    "main_training_function": (
        ("main", None),
        "only Accelerate's TPU launcher calls a function by name; trainer launch runs the script. "
        'Write main_training_function: main and call your function under `if __name__ == "__main__":`.',
    ),
    "tpu_env": (
        ([], None),
        "it configures TPU pods for `accelerate tpu-config`, which trainer has no counterpart of. "
        "Remove it (or write tpu_env: []).",
    ),
    "tpu_use_cluster": (
        (False, None),
        "it configures TPU pods for `accelerate tpu-config`, which trainer has no counterpart of. "
        "Write tpu_use_cluster: false.",
    ),
    "tpu_use_sudo": (
        (False, None),
        "it configures TPU pods for `accelerate tpu-config`, which trainer has no counterpart of. "
        "Write tpu_use_sudo: false.",
    ),
}
# Engine options in the file, and the distributed_type whose strategy reads them.
_ENGINE_OPTIONS = {"fsdp_config": "FSDP", "deepspeed_config": "DEEPSPEED"}


@dataclass
class LaunchConfig:
    """What ``trainer launch`` needs to start a job; field names are Accelerate's.

    ``num_processes`` is the total over all machines, as in Accelerate: 2 machines and
    ``num_processes: 16`` start 8 processes on each (`processes_per_machine`).

    ``strategy`` is trainer's own key: a registered strategy name that overrides the one
    ``distributed_type`` starts (``"model_parallel"`` has no distributed_type of its own). Left
    empty it is filled in from ``distributed_type``, and `to_dict` leaves it out again, so a file
    that does not need it stays readable by Accelerate. ``where`` opens error messages (the
    loader passes ``"launch config file PATH"``).

    Raises:
        ConfigurationError: a value out of range, an unregistered strategy, or a key set to a
            value ``trainer launch`` would not act on (the message says what to write instead).
    """

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    strategy: str = ""
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
    where: InitVar[str] = "launch config"

    def __post_init__(self, where: str) -> None:
        self.distributed_type = str(self.distributed_type).upper()
        if self.distributed_type not in DISTRIBUTED_TYPES:
            raise ConfigurationError(
                f"{where}: distributed_type={self.distributed_type!r}; expected one of {DISTRIBUTED_TYPES}."
            )
        self.strategy = _checked_strategy(self.strategy, self.distributed_type, where)
        self.mixed_precision = str(self.mixed_precision).lower()
        if self.mixed_precision not in _PRECISIONS:
            raise ConfigurationError(
                f"{where}: mixed_precision={self.mixed_precision!r}; expected one of {_PRECISIONS}."
            )
        _check_layout(self, where)
        self.gpu_ids = "all" if self.gpu_ids is None else "".join(str(self.gpu_ids).split())
        for name in (*_ENGINE_OPTIONS, "megatron_lm_config", "dynamo_config"):
            value = {} if getattr(self, name) is None else getattr(self, name)
            if not isinstance(value, dict):
                raise ConfigurationError(
                    f"{where}: {name}={describe(value)}; expected a mapping of options (or {{}})."
                )
            setattr(self, name, value)
        _refuse_unused(self, where)

    @property
    def processes_per_machine(self) -> int:
        """``num_processes / num_machines``: what torchrun starts on each machine."""
        return self.num_processes // self.num_machines

    def to_dict(self) -> dict[str, Any]:
        """The keys as a file holds them: ``strategy`` only where distributed_type does not imply it."""
        data = dataclasses.asdict(self)
        if data["strategy"] == _STRATEGY_OF[self.distributed_type]:
            del data["strategy"]
        return data


def _check_layout(config: LaunchConfig, where: str) -> None:
    """Machines and processes: counts >= 1, a total that divides by the machines, a valid rank."""
    for name in ("num_machines", "num_processes"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{where}: {name}={describe(value)}; expected an int >= 1.")
    if config.num_machines > 1 and not config.main_process_ip:
        raise ConfigurationError(
            f"{where}: num_machines > 1 needs main_process_ip (the address of machine_rank 0)."
        )
    if config.num_processes % config.num_machines:
        per = max(1, round(config.num_processes / config.num_machines))
        raise ConfigurationError(
            f"{where}: num_processes={config.num_processes} is not a multiple of "
            f"num_machines={config.num_machines}. num_processes is the total over all machines "
            "(Accelerate's meaning) and every machine runs num_processes / num_machines. "
            f"Write a multiple of {config.num_machines}, e.g. num_processes: "
            f"{config.num_machines * per} for {per} per machine."
        )
    if (
        not isinstance(config.machine_rank, int)
        or not 0 <= config.machine_rank < config.num_machines
    ):
        raise ConfigurationError(
            f"{where}: machine_rank={describe(config.machine_rank)}; expected an int from 0 to "
            f"num_machines - 1 = {config.num_machines - 1} (this machine's place in the job)."
        )


def _checked_strategy(strategy: str | None, distributed_type: str, where: str) -> str:
    """The strategy name to launch: the one given (if registered), else distributed_type's."""
    if not strategy:
        return _STRATEGY_OF[distributed_type]
    if strategy not in STRATEGY_REGISTRY:
        raise ConfigurationError(
            f"{where}: strategy={describe(strategy)} is not a registered strategy; expected one of "
            f"{sorted(STRATEGY_REGISTRY)}. Remove the key to launch distributed_type={distributed_type}'s "
            f"{_STRATEGY_OF[distributed_type]!r}."
        )
    return strategy


def _refuse_unused(config: LaunchConfig, where: str) -> None:
    """Raise for a key whose value ``trainer launch`` would silently not act on."""
    for key, (off_values, fix) in _OFF_VALUES.items():
        value = getattr(config, key)
        if value not in off_values:
            raise ConfigurationError(f"{where}: {key}={describe(value)} is not supported: {fix}")
    for key, distributed_type in _ENGINE_OPTIONS.items():
        owner = _STRATEGY_OF[distributed_type]
        if getattr(config, key) and config.strategy != owner:
            raise ConfigurationError(
                f"{where}: {key} is read only by the {owner!r} strategy, but this config launches "
                f"{config.strategy!r}. Launch it with distributed_type: {distributed_type} and no "
                f"other strategy (neither the strategy key nor --strategy), or remove {key}."
            )
    if config.megatron_lm_config:
        raise ConfigurationError(
            f"{where}: megatron_lm_config={describe(config.megatron_lm_config)} is not supported: "
            f"{_megatron_fix(config.megatron_lm_config)}"
        )
    compile_options = _compile_options(config.dynamo_config)
    if compile_options:
        raise ConfigurationError(
            f"{where}: dynamo_config={describe(config.dynamo_config)} is not supported: the "
            "launched processes do not read Accelerate's ACCELERATE_DYNAMO_* variables. Remove "
            f"dynamo_config and compile in the script: Trainer(compile={compile_options!r}), or "
            f"Accelerator(dynamo_backend={compile_options['backend']!r})."
        )


def _megatron_fix(options: dict[str, Any]) -> str:
    """MegatronStrategy takes its sizes in the script; spell out the call for these options."""
    names = {
        "megatron_lm_tp_degree": "tensor_model_parallel_size",
        "megatron_lm_pp_degree": "pipeline_model_parallel_size",
        "megatron_lm_sequence_parallelism": "sequence_parallel",
    }
    arguments = ", ".join(f"{names[k]}={options[k]!r}" for k in names if k in options)
    call = f"strategy=MegatronStrategy({arguments})"
    if "megatron_lm_gradient_clipping" in options:
        call += f", gradient_clip_val={options['megatron_lm_gradient_clipping']!r}"
    others = sorted(set(options) - {*names, "megatron_lm_gradient_clipping"})
    text = (
        "MegatronStrategy takes its options in the script. Remove megatron_lm_config, keep "
        f"distributed_type: MEGATRON_LM and pass Trainer({call})."
    )
    if others:
        text += f" {others} have no MegatronStrategy option."
    return text


def _compile_options(dynamo: dict[str, Any]) -> dict[str, Any]:
    """Accelerate's dynamo_config as torch.compile options; empty when compilation is off."""
    backend = str(dynamo.get("dynamo_backend", "NO")).lower()
    if backend == "no":
        return {}
    options: dict[str, Any] = {"backend": backend}
    if dynamo.get("dynamo_mode") not in (None, "default"):
        options["mode"] = dynamo["dynamo_mode"]
    if dynamo.get("dynamo_use_fullgraph"):
        options["fullgraph"] = True
    if dynamo.get("dynamo_use_dynamic"):
        options["dynamic"] = True
    return options


def default_config_path() -> Path:
    """``$XDG_CACHE_HOME/trainer/default_config.yaml``, else under ``~/.cache``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "trainer" / "default_config.yaml"


def load_launch_config(path: str | os.PathLike[str] | None = None) -> LaunchConfig:
    """Read ``path`` (or the default file if it exists; else defaults) into a LaunchConfig.

    Raises:
        ConfigurationError: the file is missing, not YAML or not a mapping, has unknown keys,
            or a value `LaunchConfig` refuses; the message names the file.
    """
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
    unknown = sorted(map(str, set(data) - known))
    if unknown:
        raise ConfigurationError(
            f"launch config file {file}: unknown keys {unknown}. Valid keys: {sorted(known)}. "
            "Remove or rename them (Accelerate keys for features trainer does not have, such as "
            "ipex_config or mpirun_config, are not read)."
        )
    return LaunchConfig(**data, where=f"launch config file {file}")


def write_launch_config(config: LaunchConfig, path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``config`` as YAML to ``path`` (default location when None); return the path."""
    import yaml

    file = Path(path) if path is not None else default_config_path()
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    return file
