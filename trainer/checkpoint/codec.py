"""JSON with tensors by reference: how ``state.json`` holds everything that is not a weight.

`encode` turns a nest of dicts, lists, tuples, sets, numbers, strings, bytes, tensors and numpy
arrays into
JSON-able data, moving every tensor into a ``sink`` dict (later written as safetensors) and leaving
``{"__tensor__": key}`` in its place. `decode` reverses it. Nothing here ever unpickles:
a type it does not know is refused with the path to the value.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

import torch

from trainer.errors import CheckpointError, describe

__all__ = ["decode", "encode"]

_TENSOR, _TUPLE, _DICT, _NDARRAY, _BYTES, _FLOAT, _SET, _FROZENSET = (
    "__tensor__",
    "__tuple__",
    "__dict__",
    "__ndarray__",
    "__bytes__",
    "__float__",
    "__set__",
    "__frozenset__",
)
_MARKERS = {_TENSOR, _TUPLE, _DICT, _NDARRAY, _BYTES, _FLOAT, _SET, _FROZENSET}
_SETS = {_SET: set, _FROZENSET: frozenset}
_FIX = "The file is corrupt or was edited after saving; resume from another checkpoint or re-save."
# Values `encode` and `decode` give back as they are: a list of only these (Python's RNG state
# holds 625 ints) is copied in one pass instead of one call per element.
_PLAIN = frozenset({int, str, bool, type(None)})
_PLAIN_LOADED = _PLAIN | {float}  # json.loads makes only finite floats


def encode(value: Any, sink: dict[str, torch.Tensor], path: str) -> Any:
    """JSON-able form of ``value``; tensors go into ``sink`` under keys derived from ``path``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(value, torch.Tensor):
        key = path if path not in sink else f"{path}#{len(sink)}"
        sink[key] = value.detach().cpu().contiguous()
        return {_TENSOR: key}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (_MARKERS & set(value)):
            return {k: encode(v, sink, f"{path}.{k}") for k, v in value.items()}
        return {
            _DICT: [
                [encode(k, sink, f"{path}.key{i}"), encode(v, sink, f"{path}.{k}")]
                for i, (k, v) in enumerate(value.items())
            ]
        }
    if isinstance(value, tuple):
        if _is_plain(value, _PLAIN):
            return {_TUPLE: list(value)}
        return {_TUPLE: [encode(v, sink, f"{path}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, set | frozenset):  # as Lightning keeps them (it pickles)
        marker = _FROZENSET if isinstance(value, frozenset) else _SET
        return {marker: [encode(v, sink, f"{path}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        if _is_plain(value, _PLAIN):
            return list(value)
        return [encode(v, sink, f"{path}.{i}") for i, v in enumerate(value)]
    if isinstance(value, bytes):
        return {_BYTES: base64.b64encode(value).decode("ascii")}
    if type(value).__module__ == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray):
            return {_NDARRAY: encode(torch.from_numpy(value.copy()), sink, path)}
        if isinstance(value, np.generic):
            return encode(value.item(), sink, path)
    raise CheckpointError(
        f"cannot store a {type(value).__name__} at {path!r} in a checkpoint: values must be "
        "numbers, strings, bytes, lists, dicts, tuples, sets, tensors or numpy arrays (nothing "
        "is pickled). "
        "Convert it in state_dict() / on_save_checkpoint."
    )


def decode(
    value: Any, tensors: Mapping[str, torch.Tensor], *, source: str = "state.json", path: str = ""
) -> Any:
    """Rebuild what `encode` produced, taking tensors from ``tensors``.

    Raises:
        CheckpointError: a marker holds a malformed value, or refers to a tensor no file holds;
            the message names ``source`` and the dotted path of the value.
    """
    if isinstance(value, list):
        if _is_plain(value, _PLAIN_LOADED):
            return value
        return [decode(v, tensors, source=source, path=_join(path, i)) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((marker, inner),) = value.items()
        if marker in _MARKERS:
            try:
                return _decode_marked(marker, inner, tensors, source, path)
            except (TypeError, ValueError, binascii.Error) as err:
                raise CheckpointError(
                    f"{source}: field {path or '(top level)'!r} holds a malformed {marker} value "
                    f"{describe(inner)} ({err}). {_FIX}"
                ) from err
    return {k: decode(v, tensors, source=source, path=_join(path, k)) for k, v in value.items()}


def _decode_marked(
    marker: str, inner: Any, tensors: Mapping[str, torch.Tensor], source: str, path: str
) -> Any:
    if marker == _TENSOR:
        if not isinstance(inner, str) or inner not in tensors:
            raise CheckpointError(
                f"{source}: field {path or '(top level)'!r} refers to tensor {describe(inner)}, "
                f"which no tensor file holds. {_FIX}"
            )
        return tensors[inner]
    if marker == _FLOAT:
        if inner not in ("inf", "-inf", "nan"):
            raise ValueError("expected 'inf', '-inf' or 'nan'")
        return float(inner)
    if marker == _BYTES:
        if not isinstance(inner, str):
            raise TypeError("expected base64 text")
        return base64.b64decode(inner, validate=True)
    if not isinstance(inner, list) and marker != _NDARRAY:
        raise TypeError("expected a list")
    if marker == _TUPLE:
        if _is_plain(inner, _PLAIN_LOADED):
            return tuple(inner)
        return tuple(
            decode(v, tensors, source=source, path=_join(path, i)) for i, v in enumerate(inner)
        )
    if marker in _SETS:  # an unhashable element (a dict) is a TypeError: refused by the caller
        return _SETS[marker](
            _hashable(decode(v, tensors, source=source, path=_join(path, i)))
            for i, v in enumerate(inner)
        )
    if marker == _DICT:
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in inner):
            raise ValueError("expected [key, value] pairs")
        return {
            _hashable(decode(k, tensors, source=source, path=_join(path, f"key{i}"))): decode(
                v, tensors, source=source, path=_join(path, i)
            )
            for i, (k, v) in enumerate(inner)
        }
    array = decode(inner, tensors, source=source, path=path)
    if not isinstance(array, torch.Tensor):
        raise TypeError("expected a tensor reference")
    return array.numpy()


def _is_plain(values: list[Any] | tuple[Any, ...], plain: frozenset[type]) -> bool:
    return set(map(type, values)) <= plain  # in C: no Python call per element


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key
