"""Hyperparameters as trackers store them: one dict, flat ``"outer/inner"`` keys, YAML-safe values.

Shared by the loggers (CSV, TensorBoard, MLflow, W&B); nothing here imports a tracker.
"""

from __future__ import annotations

import argparse
import enum
import numbers
from collections.abc import Mapping
from typing import Any

from trainer.errors import ConfigurationError, describe

__all__ = ["as_dict", "flatten_params", "to_yaml_safe"]


def as_dict(params: Any, where: str) -> dict[str, Any]:
    """``params`` as a dict (Namespaces included), or an error naming the call."""
    if isinstance(params, argparse.Namespace):
        return vars(params)
    if not isinstance(params, Mapping):
        raise ConfigurationError(
            f"{where} expected a dict or an argparse.Namespace, received {describe(params)}. "
            f"Pass e.g. {{'lr': 0.1}}."
        )
    return dict(params)


def flatten_params(params: Mapping[str, Any], parent: str = "") -> dict[str, Any]:
    """Nested dicts (and Namespaces) as ``"outer/inner"`` keys: trackers store flat key/values."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent}/{key}" if parent else str(key)
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, name))
        else:
            flat[name] = value
    return flat


def to_yaml_safe(value: Any) -> Any:
    """What ``yaml.safe_dump`` can write: plain scalars, lists and dicts; an Enum as its name;
    anything else as str()."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return {_to_yaml_key(key): to_yaml_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_yaml_safe(item) for item in value]
    if isinstance(value, enum.Enum):  # its name, as Lightning's hparams.yaml
        return value.name
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def _to_yaml_key(key: Any) -> Any:
    """Mapping keys stay plain scalars; others (tuples, enums, ...) become their str()."""
    return key if type(key) in (bool, int, float, str) else str(key)
