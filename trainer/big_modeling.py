"""Big-model helpers: build a model without memory, load weights into it tensor by tensor.

``init_empty_weights`` / ``init_on_device`` create parameters on the meta device (or any device)
as modules are constructed; ``load_checkpoint_in_model`` fills a model from a checkpoint
directory, a ``save_model`` directory, a sharded index, a single safetensors file or a legacy
pickle (read with ``weights_only=True``), one tensor at a time. Device maps, offloading and
dispatch (Accelerate's ``infer_auto_device_map`` / ``dispatch_model`` family) are not here yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.format import MODEL_FILE, MODEL_INDEX, is_checkpoint_dir, read_manifest
from trainer.checkpoint.legacy import LEGACY_SUFFIXES, load_weights_file
from trainer.errors import CheckpointError, ConfigurationError

__all__ = ["init_empty_weights", "init_on_device", "load_checkpoint_in_model"]


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = False) -> Iterator[None]:
    """Create every parameter (and buffer, if asked) of modules built inside on ``device``.

    Example:
        >>> with init_on_device("meta"):
        ...     layer = torch.nn.Linear(100_000, 100_000)  # 10B parameters, no memory
        >>> layer.weight.device
        device(type='meta')
    """
    device = torch.device(device)
    original_parameter = torch.nn.Module.register_parameter
    original_buffer = torch.nn.Module.register_buffer

    def register_parameter(
        module: torch.nn.Module, name: str, param: torch.nn.Parameter | None
    ) -> None:
        original_parameter(module, name, param)
        if param is not None:
            kwargs = {
                k: v
                for k, v in module._parameters[name].__dict__.items()
                if k != "_is_hf_initialized"
            }
            module._parameters[name] = type(param)(
                module._parameters[name].to(device), requires_grad=param.requires_grad, **kwargs
            )

    def register_buffer(
        module: torch.nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        original_buffer(module, name, tensor, persistent=persistent)
        if tensor is not None:
            module._buffers[name] = module._buffers[name].to(device)

    torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    if include_buffers:
        torch.nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]
    try:
        with torch.device(device) if include_buffers else contextlib.nullcontext():
            yield
    finally:
        torch.nn.Module.register_parameter = original_parameter  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = original_buffer  # type: ignore[method-assign]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with parameters on the meta device: any size, no memory, no init time."""
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


def _weight_files(checkpoint: Path) -> list[Path]:
    """The tensor files behind ``checkpoint``, whatever form it takes."""
    if checkpoint.is_dir():
        if is_checkpoint_dir(checkpoint):
            files = read_manifest(checkpoint)["files"]
            if MODEL_FILE in files:
                return [checkpoint / MODEL_FILE]
            checkpoint = checkpoint / MODEL_INDEX
        elif (checkpoint / MODEL_FILE).is_file():
            return [checkpoint / MODEL_FILE]
        elif (checkpoint / MODEL_INDEX).is_file():
            checkpoint = checkpoint / MODEL_INDEX
        else:
            legacy = [
                checkpoint / f"pytorch_model{s}"
                for s in (".bin",)
                if (checkpoint / f"pytorch_model{s}").is_file()
            ]
            if not legacy:
                raise CheckpointError(
                    f"{checkpoint} holds no model weights (no {MODEL_FILE}, {MODEL_INDEX} or pytorch_model.bin)."
                )
            return legacy
    if checkpoint.name.endswith(".index.json"):
        index = json.loads(checkpoint.read_text(encoding="utf-8"))
        return [checkpoint.parent / name for name in sorted(set(index["weight_map"].values()))]
    if checkpoint.suffix == ".safetensors" or checkpoint.suffix in LEGACY_SUFFIXES:
        return [checkpoint]
    raise CheckpointError(
        f"load_checkpoint_in_model: cannot read {checkpoint} (expected a directory, .safetensors, .index.json or {'/'.join(LEGACY_SUFFIXES)})."
    )


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                aliases = json.loads((handle.metadata() or {}).get("aliases", "{}"))
                for name in handle.keys():
                    tensor = handle.get_tensor(name)
                    yield name, tensor
                    for alias, kept in aliases.items():
                        if kept == name:
                            yield alias, tensor
        else:
            yield from load_weights_file(file)["state_dict"].items()


def load_checkpoint_in_model(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: dict[str, Any] | None = None,
    dtype: torch.dtype | str | None = None,
    strict: bool = False,
) -> dict[str, list[str]]:
    """Load weights into ``model`` one tensor at a time, also into an empty-weights model.

    Args:
        checkpoint: a checkpoint or ``save_model`` directory, a ``.safetensors`` file, a
            ``model.safetensors.index.json`` or a legacy ``.bin``/``.pt`` file.
        dtype: cast floating-point weights to this dtype.
        strict: raise CheckpointError listing missing and unexpected keys and shape mismatches.

    Returns:
        ``{"missing_keys": [...], "unexpected_keys": [...], "mismatched_keys": [...]}``.
    """
    if device_map is not None:
        raise ConfigurationError(
            "load_checkpoint_in_model(device_map=...): device maps are not supported in this version; load on one device."
        )
    target_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    expected = dict(model.state_dict(keep_vars=True))
    seen: set[str] = set()
    unexpected: list[str] = []
    mismatched: list[str] = []
    for name, tensor in _iter_tensors(_weight_files(Path(checkpoint))):
        if name not in expected:
            unexpected.append(name)
            continue
        current = expected[name]
        if tuple(current.shape) != tuple(tensor.shape):
            mismatched.append(
                f"{name}: checkpoint {tuple(tensor.shape)} vs model {tuple(current.shape)}"
            )
            seen.add(name)  # present, just the wrong shape: reported once, as mismatched
            continue
        if target_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(target_dtype)
        _set_tensor(model, name, tensor)
        seen.add(name)
    report = {
        "missing_keys": sorted(set(expected) - seen),
        "unexpected_keys": sorted(unexpected),
        "mismatched_keys": mismatched,
    }
    problems = {k: v for k, v in report.items() if v}
    if problems:
        message = f"load_checkpoint_in_model({os.fspath(checkpoint)!r}): " + "; ".join(
            f"{k}: {v}" for k, v in problems.items()
        )
        if strict:
            raise CheckpointError(message)
        warnings.warn(message, stacklevel=2)
    return report


def _set_tensor(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Put ``value`` in place of parameter/buffer ``name`` (replacing meta tensors)."""
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    if attr in owner._parameters:
        old = owner._parameters[attr]
        if old.device.type == "meta":
            owner._parameters[attr] = torch.nn.Parameter(
                value.to(old.dtype if not value.is_floating_point() else value.dtype),
                requires_grad=old.requires_grad,
            )
        else:
            with torch.no_grad():
                old.copy_(value)
    elif attr in owner._buffers:
        old = owner._buffers[attr]
        if old is None or old.device.type == "meta":
            owner._buffers[attr] = value
        else:
            old.copy_(value)
