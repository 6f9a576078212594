"""``TrainModule.load_from_checkpoint`` and ``DataModule.load_from_checkpoint``: Lightning's way
back from a checkpoint to a module — the class built again from its saved hyperparameters, then
given the checkpoint's weights (a TrainModule) or state (a DataModule).

Every source is read without running code: a checkpoint directory (verified against its manifest
first; FSDP / DeepSpeed shards are merged into full weights in this process, as ``trainer
checkpoint consolidate`` does), a ``.safetensors`` file, or a Lightning ``.ckpt`` (read with
``weights_only=True``). Only the class named in the call is ever built — a checkpoint names no
class to import.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from trainer.errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    ConfigurationError,
    describe,
)
from trainer.trainer.hyperparameters import AttributeDict

if TYPE_CHECKING:
    from trainer.trainer.module import DataModule, TrainModule

__all__ = ["load_datamodule", "load_module", "read_checkpoint_anywhere", "restricted_classmethod"]

_Owner = TypeVar("_Owner")


class restricted_classmethod(Generic[_Owner]):  # lower case: a decorator, like classmethod
    """A classmethod that refuses to run when called on an instance.

    ``model.load_from_checkpoint(path)`` reads as if it loaded into ``model``; it builds a new
    module instead, which the caller then drops. Lightning 2 raises for that call; so does this.
    The method stays visible (``help``, ``inspect``) on instances.
    """

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method
        functools.update_wrapper(self, method)

    def __get__(self, instance: Any, owner: type[_Owner] | None = None) -> Callable[..., Any]:
        cls = owner if owner is not None else type(instance)

        @functools.wraps(self.method)
        def bound(*args: Any, **kwargs: Any) -> Any:
            if instance is not None:
                raise ConfigurationError(
                    f"{cls.__name__}.{self.method.__name__} was called on an instance: it builds "
                    f"a new {cls.__name__} and returns it (it does not load into this one). Call "
                    f"it on the class and keep the result: model = "
                    f"{cls.__name__}.{self.method.__name__}(path)."
                )
            return self.method(cls, *args, **kwargs)

        return bound


def read_checkpoint_anywhere(path: str | os.PathLike[str], device: str) -> dict[str, Any]:
    """The checkpoint dict at ``path`` with full model weights in ``"state_dict"``.

    A checkpoint directory is verified before anything in it is used; a sharded one (DCP or
    DeepSpeed ZeRO) has its shards merged in this process. A file is a ``.safetensors`` file or a
    legacy pickle read with ``weights_only=True`` (Lightning ``.ckpt`` included).

    Raises:
        CheckpointError: no such path, a file or field that fails verification, or shards that
            hold no weights.
    """
    from trainer.checkpoint import load_weights_file, read_checkpoint
    from trainer.strategies.full_weights import is_sharded, read_full_weights

    source = Path(path)
    if not source.exists():
        raise CheckpointNotFoundError(f"load_from_checkpoint: {os.fspath(path)!r} does not exist.")
    if not source.is_dir():
        return load_weights_file(source, device)
    checkpoint = read_checkpoint(source, device=device)
    if is_sharded(source):
        weights = read_full_weights(source)
        checkpoint["state_dict"] = {k: v.to(device) for k, v in weights.items()}
    return checkpoint


def _device(map_location: str | torch.device | None) -> str:
    if map_location is None:
        return "cpu"
    if isinstance(map_location, str | torch.device):
        return str(torch.device(map_location))
    raise ConfigurationError(
        f"load_from_checkpoint(map_location={describe(map_location)}): expected None, a device "
        "name such as 'cpu' or 'cuda:0', or a torch.device (a checkpoint directory is saved on "
        "the CPU; its tensors go where map_location says)."
    )


def _hparams_file(hparams_file: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a YAML file (``hparams.yaml`` as the CSV / TensorBoard loggers write it)."""
    import yaml

    file = Path(hparams_file)
    if file.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigurationError(
            f"load_from_checkpoint(hparams_file={os.fspath(hparams_file)!r}): expected a .yaml "
            "or .yml file, such as the hparams.yaml a logger writes."
        )
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigurationError(
            f"load_from_checkpoint(hparams_file={os.fspath(hparams_file)!r}): cannot read it: {err}"
        ) from err
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigurationError(
            f"load_from_checkpoint(hparams_file={os.fspath(hparams_file)!r}): holds "
            f"{describe(loaded)}, not a mapping of hyperparameters."
        )
    return loaded


def _instantiate(cls: type[Any], hparams: dict[str, Any], source: str) -> Any:
    """``cls(**hparams)``, keeping only the arguments its ``__init__`` takes (all of them when it
    takes ``**kwargs``), as Lightning does."""
    signature = inspect.signature(cls.__init__)
    parameters = list(signature.parameters.values())[1:]  # without self
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    names = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    arguments = hparams if takes_any else {k: v for k, v in hparams.items() if k in names}
    missing = [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in arguments
    ]
    if missing:
        raise ConfigurationError(
            f"{cls.__name__}.load_from_checkpoint({source!r}): {cls.__name__}.__init__ needs "
            f"{missing}, which the checkpoint's hyperparameters do not hold (saved: "
            f"{sorted(hparams)}). Pass them as keywords, e.g. load_from_checkpoint(path, "
            f"{missing[0]}=...), or call self.save_hyperparameters() in __init__."
        )
    return cls(**arguments)


def _hparams(
    cls: type[Any],
    checkpoint: dict[str, Any],
    keys: tuple[str, str],
    hparams_file: str | os.PathLike[str] | None,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """The keyword arguments to build ``cls`` with: the saved hyperparameters (replaced by
    ``hparams_file``'s), updated with ``overrides``. Saved from one dict or Namespace argument
    (``keys[1]``, Lightning's ``hparams_name``), they go back as that argument, a dict."""
    saved = checkpoint.get(keys[0]) or {}
    hparams = dict(_hparams_file(hparams_file) if hparams_file is not None else saved)
    holder = checkpoint.get(keys[1])
    if isinstance(holder, str) and holder != "kwargs":
        parameters = inspect.signature(cls.__init__).parameters
        if holder in parameters and holder not in overrides:
            hparams = {holder: AttributeDict(hparams)}
    hparams.update(overrides)
    return hparams


def load_module(
    cls: type[TrainModule],
    checkpoint_path: str | os.PathLike[str],
    map_location: str | torch.device | None,
    hparams_file: str | os.PathLike[str] | None,
    strict: bool | None,
    overrides: dict[str, Any],
) -> TrainModule:
    """What `TrainModule.load_from_checkpoint` returns (see there)."""
    device = _device(map_location)
    checkpoint = read_checkpoint_anywhere(checkpoint_path, device)
    hparams = _hparams(
        cls, checkpoint, ("hyper_parameters", "hparams_name"), hparams_file, overrides
    )
    module = _instantiate(cls, hparams, os.fspath(checkpoint_path))
    module.on_load_checkpoint(checkpoint)
    weights = checkpoint.get("state_dict") or {}
    if not weights:
        warnings.warn(
            f"{cls.__name__}.load_from_checkpoint({os.fspath(checkpoint_path)!r}): the checkpoint "
            "holds no model weights; the module keeps its initial ones.",
            stacklevel=3,
        )
        return module
    strict = module.strict_loading if strict is None else strict
    try:
        result = module.load_state_dict(weights, strict=strict)
    except RuntimeError as err:
        raise CheckpointMismatchError(
            f"{cls.__name__}.load_from_checkpoint({os.fspath(checkpoint_path)!r}): the "
            f"checkpoint's weights do not fit {cls.__name__}: {err}"
        ) from err
    if not strict and (result.missing_keys or result.unexpected_keys):
        warnings.warn(
            f"{cls.__name__}.load_from_checkpoint({os.fspath(checkpoint_path)!r}, strict=False): "
            f"missing keys {result.missing_keys}, unexpected keys {result.unexpected_keys}.",
            stacklevel=3,
        )
    return module.to(device)


def load_datamodule(
    cls: type[DataModule],
    checkpoint_path: str | os.PathLike[str],
    hparams_file: str | os.PathLike[str] | None,
    overrides: dict[str, Any],
) -> DataModule:
    """What `DataModule.load_from_checkpoint` returns (see there)."""
    checkpoint = read_checkpoint_anywhere(checkpoint_path, "cpu")
    keys = ("datamodule_hyper_parameters", "datamodule_hparams_name")
    hparams = _hparams(cls, checkpoint, keys, hparams_file, overrides)
    datamodule = _instantiate(cls, hparams, os.fspath(checkpoint_path))
    # Lightning keeps it under the class's qualified name
    state = checkpoint.get("datamodule", checkpoint.get(cls.__qualname__))
    if state is not None:
        datamodule.load_state_dict(state)
    return datamodule
