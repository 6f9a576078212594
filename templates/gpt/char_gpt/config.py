"""Read a run config (YAML) and build the objects it names, with plain Python.

The file has the sections LightningCLI users know, so ``trainer fit --config <file>`` reads the
same file:

    seed_everything: 0
    model:
      class_path: char_gpt.module.GPTModule
      init_args: {n_layer: 4, lr: 0.003}
    data:
      class_path: char_gpt.datamodule.CharDataModule
      init_args: {batch_size: 32}
    trainer:
      max_epochs: 10
      strategy: single
      precision: 32-true
      callbacks:
        - class_path: trainer.callbacks.EarlyStopping
          init_args: {monitor: val/loss}

Overrides use the dotted flags of ``trainer fit``: ``--trainer.max_epochs 3``,
``--model.init_args.lr=0.01`` or the short ``--model.lr 0.01``. A value is read as YAML: ``3`` is
an int, ``null`` is None, ``[a, b]`` a list. This module owns reading and building only; what
runs the objects is ``char_gpt.run``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from trainer import ConfigurationError, Trainer

__all__ = ["SECTIONS", "apply_overrides", "build_trainer", "instantiate", "load_config"]

# The top-level keys a run config may have (LightningCLI's, minus the optimizer shortcuts:
# the TrainModule's configure_optimizers owns the optimizer here).
SECTIONS = ("seed_everything", "model", "data", "trainer", "ckpt_path")


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read the YAML run config at ``path`` and apply ``--key.sub value`` ``overrides``.

    Raises:
        ConfigurationError: the file is missing, is not a mapping, has an unknown section, or an
            override is malformed.

    Example:
        >>> config = load_config("configs/smoke.yaml", ["--trainer.max_epochs", "2"])
        >>> config["trainer"]["max_epochs"]
        2
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(f"run config {file} does not exist. Pass --config <file.yaml>.")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigurationError(f"run config {file} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"run config {file}: expected a mapping with sections {SECTIONS}, "
            f"found {type(data).__name__}."
        )
    config = apply_overrides(data, overrides)
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise ConfigurationError(
            f"run config {file}: unknown sections {unknown}. Valid sections: {list(SECTIONS)}."
        )
    return config


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``config`` with ``["--a.b", "1", "--c=x"]`` applied (values parsed as YAML).

    A key under a ``class_path`` section that is not ``class_path``/``init_args`` goes into its
    ``init_args`` (``--model.lr 0.01`` sets ``model.init_args.lr``), as in ``trainer fit``.
    """
    result = copy.deepcopy(config)
    for key, text in _pairs(overrides):
        node = result
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            node = _child_section(node, part, ".".join(parts[: depth + 1]), key)
        leaf = parts[-1]
        if "class_path" in node and leaf not in ("class_path", "init_args"):
            node = _init_args(node)
        node[leaf] = yaml.safe_load(text)
    return result


def _child_section(node: dict[str, Any], part: str, path: str, key: str) -> dict[str, Any]:
    """The mapping ``node[part]`` (created if absent), stepping into init_args when needed."""
    if "class_path" in node and part not in ("class_path", "init_args"):
        node = _init_args(node)
    child = node.get(part)
    if child is None:
        child = node[part] = {}
    if not isinstance(child, dict):
        raise ConfigurationError(
            f"override --{key}: {path} is {child!r}, not a section; override {path} itself."
        )
    return child


def _init_args(node: dict[str, Any]) -> dict[str, Any]:
    """``node["init_args"]``, created when absent or empty (``init_args:`` reads as None)."""
    if node.get("init_args") is None:
        node["init_args"] = {}
    return node["init_args"]


def _pairs(overrides: Sequence[str]) -> list[tuple[str, str]]:
    """``["--a.b", "1", "--c=2"]`` -> ``[("a.b", "1"), ("c", "2")]``."""
    pairs: list[tuple[str, str]] = []
    items = list(overrides)
    index = 0
    while index < len(items):
        flag = items[index]
        if not flag.startswith("--") or len(flag) == 2:
            raise ConfigurationError(
                f"override {flag!r}: expected --section.key VALUE or --section.key=VALUE."
            )
        if "=" in flag:
            key, _, value = flag[2:].partition("=")
            index += 1
        elif index + 1 < len(items):
            key, value = flag[2:], items[index + 1]
            index += 2
        else:
            raise ConfigurationError(f"override {flag}: no value follows it.")
        pairs.append((key, value))
    return pairs


def instantiate(spec: Any, where: str) -> Any:
    """Build ``{"class_path": "pkg.mod.Class", "init_args": {...}}`` (recursively; lists too).

    Anything else is returned unchanged. ``where`` names the config key in error messages.

    Raises:
        ConfigurationError: the class cannot be imported, or ``init_args`` has a key the class
            does not take (the message lists the keys it takes).
    """
    if isinstance(spec, list):
        return [instantiate(item, f"{where}[{index}]") for index, item in enumerate(spec)]
    if not isinstance(spec, dict) or "class_path" not in spec:
        return spec
    extra = sorted(set(spec) - {"class_path", "init_args"})
    if extra:
        raise ConfigurationError(
            f"{where}: unknown keys {extra} beside class_path. Put arguments under init_args."
        )
    target = _import(str(spec["class_path"]), where)
    arguments = {
        name: instantiate(value, f"{where}.init_args.{name}")
        for name, value in (spec.get("init_args") or {}).items()
    }
    check_arguments(target, arguments, f"{where}.init_args")
    return target(**arguments)


def check_arguments(target: Any, arguments: dict[str, Any], where: str) -> None:
    """Raise when ``arguments`` has a name that ``target``'s signature does not accept."""
    parameters = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    valid = [name for name in parameters if name != "self"]
    unknown = sorted(set(arguments) - set(valid))
    if unknown:
        name = getattr(target, "__qualname__", repr(target))
        raise ConfigurationError(
            f"{where}: unknown keys {unknown} for {name}. Valid keys: {valid}."
        )


def _import(class_path: str, where: str) -> Any:
    """The object at ``"package.module.Name"``."""
    module_name, _, name = class_path.rpartition(".")
    if not module_name:
        raise ConfigurationError(
            f"{where}.class_path={class_path!r}: expected a dotted path like 'pkg.module.Class'."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigurationError(
            f"{where}.class_path={class_path!r}: cannot import {module_name!r} ({err}). Run from "
            "the project directory, or install the project with `pip install -e .`."
        ) from err
    if not hasattr(module, name):
        raise ConfigurationError(
            f"{where}.class_path={class_path!r}: {module_name} has no {name!r}."
        )
    return getattr(module, name)


def build_trainer(section: dict[str, Any] | None) -> Trainer:
    """A Trainer from the ``trainer:`` section; ``callbacks``/``logger``/``strategy`` may be
    ``class_path`` specs (or lists of them), every other key is a ``Trainer`` argument.
    """
    options = {
        name: instantiate(value, f"trainer.{name}") for name, value in (section or {}).items()
    }
    check_arguments(Trainer, options, "trainer")
    return Trainer(**options)
