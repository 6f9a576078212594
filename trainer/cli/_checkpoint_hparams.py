"""The model hyperparameters a checkpoint gives a config run (LightningCLI's ``ckpt_path``).

LightningCLI merges the ``hyper_parameters`` saved in a checkpoint into the parsed config, so
``trainer test --ckpt_path CK`` builds the model that was trained. The config parser
(jsonargparse) does more with a value than store it: it builds the class a ``class_path``
names, reads a string as YAML or JSON (a string can hold a ``class_path`` too), and imports
the dotted name given as a string to an argument typed as a class, a callable or a type. A
checkpoint is data from wherever it came from, so every such value is refused before the
parser sees it: a checkpoint cannot make the run import or build anything.
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import os
import pathlib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.errors import CheckpointError, describe

__all__ = ["checkpoint_hyperparameters"]

# Types whose values the parser only converts: a string given to them never becomes an import.
_DATA_TYPES = (
    str,
    bytes,
    bool,
    int,
    float,
    complex,
    type(None),
    os.PathLike,
    pathlib.PurePath,
    enum.Enum,
)
_CONTAINERS = (
    list,
    tuple,
    dict,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Mapping,
    collections.abc.MutableMapping,
    collections.abc.Set,
    collections.abc.Iterable,
    collections.abc.Collection,
)


def checkpoint_hyperparameters(
    ckpt_path: str | None, model_class: type | None = None
) -> dict[str, Any]:
    """The model hyperparameters saved in the checkpoint at ``ckpt_path``, as LightningCLI
    reads them to build the model; ``{}`` for None, ``"last"`` / ``"best"`` or no such path.

    Of a checkpoint directory only ``state.json`` is read, verified first (the weights are the
    Trainer's to read); a file is read with ``weights_only=True`` (a Lightning ``.ckpt``) or as
    safetensors: no code runs. The values stay data for the config parser too: refused are a
    ``class_path`` key at any depth, a string that parses (as YAML / JSON) to one, and any
    string for an argument of ``model_class`` (None: of any argument) whose type the parser
    would import a dotted name for (a class, a callable, a type).

    Raises:
        CheckpointError: the checkpoint fails verification or cannot be read, or its
            hyper_parameters are not a mapping or hold a value refused above.
    """
    if ckpt_path is None or not os.path.exists(ckpt_path):
        return {}
    from trainer.checkpoint import load_weights_file
    from trainer.checkpoint.format import read_state

    path = Path(ckpt_path)
    checkpoint = read_state(path) if path.is_dir() else load_weights_file(path)
    saved = checkpoint.get("hyper_parameters") or {}
    if not isinstance(saved, Mapping):
        raise CheckpointError(
            f"ckpt_path {ckpt_path!r}: its hyper_parameters are {describe(saved)}, not a "
            "mapping of the model's arguments."
        )
    saved = {key: value for key, value in saved.items() if key != "_instantiator"}
    refusal = _code_naming_field(saved, _argument_types(model_class))
    if refusal is not None:
        raise CheckpointError(
            f"ckpt_path {ckpt_path!r}: hyper_parameters{refusal}; the model's saved "
            "hyperparameters are taken as data only. Give the value in the config instead."
        )
    return saved


def _code_naming_field(saved: Mapping[str, Any], types_of: Mapping[str, Any] | None) -> str | None:
    """Where ``saved`` could make the parser import or build something, and why; else None."""
    for key, value in saved.items():
        field = f"[{key!r}]"
        if key in ("class_path", "_class_path"):
            return f"{field} names a class"
        found = _class_path_in(value, field)
        if found is not None:
            return found
        annotation = Any if types_of is None else types_of.get(key, Any)
        string = _first_string(value, field)
        if string is not None and (types_of is None or _may_import(annotation)):
            typed = "" if types_of is None else f", given to an argument typed {annotation!r}"
            return (
                f"{string} is a string{typed}: the config parser may import the dotted name "
                "it holds"
            )
    return None


def _class_path_in(value: Any, field: str) -> str | None:
    """The first ``class_path`` key at or under ``value`` (also inside a string holding YAML
    or JSON, which the parser would read as such), with why; else None."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = f"{field}[{key!r}]"
            if key in ("class_path", "_class_path"):
                return f"{inner} names a class"
            found = _class_path_in(item, inner)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _class_path_in(item, f"{field}[{index}]")
            if found is not None:
                return found
    elif isinstance(value, str) and "class_path" in value:
        return f"{field} is a string naming a class (class_path)"
    return None


def _first_string(value: Any, field: str) -> str | None:
    """The field of the first string at or under ``value``, else None."""
    if isinstance(value, str):
        return field
    items = value.items() if isinstance(value, Mapping) else None
    if items is None and isinstance(value, list | tuple):
        items = enumerate(value)
    for key, item in items or ():
        found = _first_string(item, f"{field}[{key!r}]")
        if found is not None:
            return found
    return None


def _argument_types(model_class: type | None) -> dict[str, Any] | None:
    """The annotation of each ``__init__`` argument of ``model_class`` (an unannotated one:
    the type of its default, else Any); None when there is no class to read."""
    if model_class is None:
        return None
    try:
        signature = inspect.signature(model_class)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(model_class.__init__)
    except Exception:  # a forward reference that does not resolve: the raw annotations
        hints = {}
    found: dict[str, Any] = {}
    for name, parameter in signature.parameters.items():
        annotation = hints.get(name, parameter.annotation)
        if annotation is inspect.Parameter.empty:
            default = parameter.default
            empty = default is inspect.Parameter.empty or default is None
            annotation = Any if empty else type(default)
        found[name] = annotation
    return found


def _may_import(annotation: Any) -> bool:
    """Whether the parser could import a dotted name given as a string for ``annotation``.

    Only types it merely converts are safe: str, numbers, paths, enums, literals, Any / object
    (a string stays a string there) and containers and unions of those. Anything else — a
    class, ``Callable``, ``type[...]``, a string annotation that did not resolve — may import.
    """
    if annotation in (Any, object):
        return False
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return False
    if origin is typing.Annotated:
        return _may_import(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType) or origin in _CONTAINERS:
        return any(_may_import(arg) for arg in typing.get_args(annotation) if arg is not ...)
    if isinstance(annotation, type):
        return not (issubclass(annotation, _DATA_TYPES) or annotation in _CONTAINERS)
    return True
