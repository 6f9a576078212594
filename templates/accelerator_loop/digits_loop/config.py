"""The run config: a YAML file read into dataclasses, with ``--section.key VALUE`` overrides.

    accelerator:          # Accelerator(...) arguments, as Accelerate names them
      mixed_precision: "no"
      gradient_accumulation_steps: 2
    model: {dropout: 0.25}
    data: {batch_size: 32}
    training: {max_epochs: 20, lr: 0.003}

A key the dataclass (or ``Accelerator``) does not have is an error that lists the valid ones.
Values in overrides are read as YAML: ``--training.max_epochs 3``, ``--accelerator.cpu=true``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from trainer import Accelerator, ConfigurationError

__all__ = ["DataConfig", "ModelConfig", "RunConfig", "TrainingConfig", "load_config"]


@dataclass
class ModelConfig:
    """Arguments of ``build_model``."""

    dropout: float = 0.25
    hidden: int = 128


@dataclass
class DataConfig:
    """Batch sizes are per process (the global batch is ``batch_size * processes``)."""

    batch_size: int = 32
    eval_batch_size: int = 256
    split_seed: int = 0


@dataclass
class TrainingConfig:
    """The loop's own settings."""

    max_epochs: int = 20
    lr: float = 3e-3
    weight_decay: float = 1e-2
    max_grad_norm: float | None = 1.0  # None: no clipping
    limit_batches: int | None = None  # stop every epoch and evaluation after this many batches
    seed: int = 0
    # Where the tracker logs, the saved model and the saved state go.
    output_dir: str = "runs/digits_loop"


@dataclass
class RunConfig:
    """The whole run: ``accelerator`` holds ``Accelerator`` keyword arguments."""

    accelerator: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "training": TrainingConfig}


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read ``path`` and apply ``["--training.max_epochs", "3", "--data.batch_size=64"]``.

    Raises:
        ConfigurationError: a missing file, an unknown section or key, or a malformed override.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(f"run config {file} does not exist. Pass --config <file.yaml>.")
    raw = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"run config {file}: expected a mapping of sections.")
    raw = _apply_overrides(raw, overrides)
    valid = ["accelerator", *_SECTIONS]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ConfigurationError(
            f"run config {file}: unknown sections {unknown}. Valid sections: {valid}."
        )
    accelerator = dict(raw.get("accelerator") or {})
    if accelerator.get("mixed_precision") is False:  # YAML reads a bare `no` as false
        accelerator["mixed_precision"] = "no"
    _check_keys("accelerator", accelerator, _accelerator_arguments())
    sections = {}
    for name, kind in _SECTIONS.items():
        values = dict(raw.get(name) or {})
        _check_keys(name, values, [f.name for f in dataclasses.fields(kind)])
        sections[name] = kind(**values)
    return RunConfig(accelerator=accelerator, **sections)


def _accelerator_arguments() -> list[str]:
    return [name for name in inspect.signature(Accelerator).parameters if name != "self"]


def _check_keys(section: str, values: dict[str, Any], valid: list[str]) -> None:
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigurationError(f"{section}: unknown keys {unknown}. Valid keys: {valid}.")


def _apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    result = copy.deepcopy(raw)
    items = list(overrides)
    index = 0
    while index < len(items):
        flag = items[index]
        if not flag.startswith("--") or "." not in flag:
            raise ConfigurationError(
                f"override {flag!r}: expected --section.key VALUE or --section.key=VALUE."
            )
        if "=" in flag:
            key, _, text = flag[2:].partition("=")
            index += 1
        elif index + 1 < len(items):
            key, text = flag[2:], items[index + 1]
            index += 2
        else:
            raise ConfigurationError(f"override {flag}: no value follows it.")
        section, _, name = key.partition(".")
        if result.get(section) is None:
            result[section] = {}
        result[section][name] = yaml.safe_load(text)
    return result
