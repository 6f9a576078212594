"""The one validator of what a checkpoint says about itself: types and ranges, before any use.

A checkpoint's hashes only prove that its files are the ones its manifest lists; anyone can
re-hash an edited file. So every field that is read back from ``manifest.json``,
``state.json``, ``model.safetensors.index.json`` or a PyTorch Lightning ``.ckpt`` is checked
here first, and a bad one raises `CheckpointError` naming the file, the field as a dotted path
(``progress.batch_idx``) and the value received. Every file name a manifest or an index gives
goes through `trainer.checkpoint.paths.resolve_inside`.

This module owns the rules (a small vocabulary of specs: `_integer`, `_record`, `_list_of`, ...
and the tables built from them); reading the files is the formats' job (``format.py``,
``legacy.py``, ``lightning.py``). Fields not named here (a callback's or a logger's own state,
user values added in ``on_save_checkpoint``) are checked by the object that reads them back.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch

from trainer.checkpoint.paths import resolve_inside
from trainer.errors import CheckpointError, describe

__all__ = [
    "MAX_COUNT",
    "check_lightning",
    "check_manifest",
    "check_model_index",
    "check_state",
    "check_tensor_aliases",
]

MAX_COUNT = 2**53 - 1  # the largest integer every JSON reader keeps exactly
_MAX_FILE_SIZE = 2**63 - 1
_MAX_WORLD_SIZE = 2**20
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_FIX = "The file is corrupt or was edited after saving; resume from another checkpoint or re-save."

Spec = Callable[[Any, str, str], None]  # (value, source file, dotted field) -> None or raise


def _refuse(source: str, field: str, value: Any, expected: str) -> NoReturn:
    raise CheckpointError(
        f"{source}: field {field!r} must be {expected}; received {describe(value)}. {_FIX}"
    )


def _join(field: str, key: object) -> str:
    return f"{field}.{key}" if field else str(key)


def _integer(minimum: int = 0, maximum: int = MAX_COUNT) -> Spec:
    """An int (not a bool, not a float) in ``[minimum, maximum]``."""

    def check(value: Any, source: str, field: str) -> None:
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if not is_int or not minimum <= value <= maximum:
            _refuse(source, field, value, f"an int from {minimum} to {maximum}")

    return check


def _number(*, is_finite: bool = False) -> Spec:
    def check(value: Any, source: str, field: str) -> None:
        is_real = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_real or (is_finite and not math.isfinite(value)):
            _refuse(source, field, value, "a finite number" if is_finite else "a number")

    return check


def _instance(kind: type, expected: str) -> Spec:
    def check(value: Any, source: str, field: str) -> None:
        if not isinstance(value, kind):
            _refuse(source, field, value, expected)

    return check


def _equal(wanted: object) -> Spec:
    def check(value: Any, source: str, field: str) -> None:
        if type(value) is not type(wanted) or value != wanted:
            _refuse(source, field, value, repr(wanted))

    return check


def _optional(spec: Spec) -> Spec:
    """``spec`` or None."""

    def check(value: Any, source: str, field: str) -> None:
        if value is not None:
            spec(value, source, field)

    return check


def _list_of(item: Spec) -> Spec:
    def check(value: Any, source: str, field: str) -> None:
        if not isinstance(value, list | tuple):
            _refuse(source, field, value, "a list")
        for index, element in enumerate(value):
            item(element, source, _join(field, index))

    return check


def _str_key(key: Any, source: str, field: str) -> None:
    if not isinstance(key, str):
        _refuse(source, field, key, "a str key")


def _mapping_of(item: Spec, *, key: Spec = _str_key) -> Spec:
    """A dict whose keys pass ``key`` (str by default) and whose values pass ``item``."""

    def check(value: Any, source: str, field: str) -> None:
        if not isinstance(value, Mapping):
            _refuse(source, field, value, "a dict")
        for name, element in value.items():
            key(name, source, _join(field, name))
            item(element, source, _join(field, name))

    return check


def _record(
    required: dict[str, Spec] | None = None, optional: dict[str, Spec] | None = None
) -> Spec:
    """A dict holding every ``required`` field, and ``optional`` ones when present; others pass."""

    def check(value: Any, source: str, field: str) -> None:
        if not isinstance(value, Mapping):
            _refuse(source, field or "(top level)", value, "a dict")
        for key, spec in (required or {}).items():
            if key not in value:
                raise CheckpointError(f"{source}: field {_join(field, key)!r} is missing. {_FIX}")
            spec(value[key], source, _join(field, key))
        for key, spec in (optional or {}).items():
            if key in value:
                spec(value[key], source, _join(field, key))

    return check


def _anything(value: Any, source: str, field: str) -> None:
    """Values whose reader checks them (a callback's state, a user value)."""


def _tensor(dtype: torch.dtype) -> Spec:
    def check(value: Any, source: str, field: str) -> None:
        if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != 1:
            _refuse(source, field, value, f"a 1-D {dtype} tensor")

    return check


def _torch_rng(value: Any, source: str, field: str) -> None:
    """What ``torch.get_rng_state()`` returns: tried on a throwaway generator."""
    _tensor(torch.uint8)(value, source, field)
    try:
        torch.Generator().set_state(value.cpu())
    except RuntimeError:
        _refuse(source, field, value, "the state torch.get_rng_state() returns")


def _python_rng(value: Any, source: str, field: str) -> None:
    """What ``random.getstate()`` returns: tried on a throwaway generator."""
    try:
        random.Random().setstate(value)
    except (TypeError, ValueError, OverflowError):
        _refuse(source, field, value, "the tuple random.getstate() returns")


def _numpy_rng(value: Any, source: str, field: str) -> None:
    """What ``numpy.random.get_state()`` returns: tried on a throwaway generator."""
    import numpy as np

    try:
        np.random.RandomState().set_state(value)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError):
        _refuse(source, field, value, "the tuple numpy.random.get_state() returns")


def _timestamp(value: Any, source: str, field: str) -> None:
    try:
        dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        _refuse(source, field, value, "an ISO 8601 time (str)")


def _digest(algorithm: str) -> Spec:
    """A sha256 or BLAKE3 digest: 64 lowercase hex digits."""

    def check(value: Any, source: str, field: str) -> None:
        if not isinstance(value, str) or _HEX_DIGEST.fullmatch(value) is None:
            _refuse(source, field, value, f"a {algorithm} (64 lowercase hex digits)")

    return check


def _parameter_key(value: Any, source: str, field: str) -> None:
    """How an optimizer state dict names a parameter: by index (``Optimizer.state_dict()``) or
    by fully-qualified name (FSDP's full, gathered optimizer state dict)."""
    if isinstance(value, str):
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or not 0 <= value <= MAX_COUNT:
        _refuse(
            source,
            field,
            value,
            f"a parameter index (an int from 0 to {MAX_COUNT}) or a parameter name (a str)",
        )


_COUNT = _integer()
_STRING = _instance(str, "a str")
_BOOLEAN = _instance(bool, "a bool")
_PROGRESS = _record(
    required={"epoch": _COUNT, "global_step": _COUNT, "batch_idx": _COUNT},
    optional={
        "last_val_step": _integer(-1),
        "total_batches": _COUNT,
        "batches_stepped": _COUNT,
        "is_epoch_ending": _BOOLEAN,
    },
)
_OPTIMIZER = _record(
    required={
        "state": _mapping_of(_anything, key=_parameter_key),
        "param_groups": _list_of(_record(required={"params": _list_of(_parameter_key)})),
    }
)
_SCHEDULER = _record(
    optional={
        "last_epoch": _integer(-1),
        "_step_count": _COUNT,
        "base_lrs": _list_of(_number(is_finite=True)),
        "_last_lr": _list_of(_number(is_finite=True)),
    }
)
_GRAD_SCALER = _record(
    optional={
        "scale": _number(is_finite=True),
        "growth_factor": _number(is_finite=True),
        "backoff_factor": _number(is_finite=True),
        "growth_interval": _integer(1),
        "_growth_tracker": _COUNT,
    }
)
_RNG = _record(
    optional={
        "python": _python_rng,
        "torch": _torch_rng,
        "numpy": _numpy_rng,
        "cuda": _list_of(_tensor(torch.uint8)),
    }
)
_ONE_LOADER = _record(
    optional={"seed": _optional(_integer(0, 2**63 - 1 - MAX_COUNT)), "epoch": _COUNT}
)
# Several train loaders read together (trainer/data/combined.py): each one's state, and the mode.
_COMBINED = _record(required={"mode": _STRING, "loaders": _list_of(_ONE_LOADER)})
_LOADER = _record(
    optional={
        "seed": _optional(_integer(0, 2**63 - 1 - MAX_COUNT)),
        "epoch": _COUNT,
        "combined": _COMBINED,
    }
)
_STATE = _record(
    optional={
        "trainer_checkpoint_version": _equal(1),
        "epoch": _COUNT,
        "global_step": _COUNT,
        "progress": _PROGRESS,
        "optimizer_states": _list_of(_OPTIMIZER),
        "lr_schedulers": _list_of(_SCHEDULER),
        "precision": _optional(_record(optional={"scaler": _GRAD_SCALER})),
        "callbacks": _optional(_mapping_of(_anything)),
        "state_dict": _mapping_of(_anything),  # a legacy file's; a directory's is safetensors
        "hyper_parameters": _optional(_mapping_of(_anything)),
        "datamodule_hyper_parameters": _optional(_mapping_of(_anything)),
        "hparams_name": _optional(_STRING),  # Lightning writes None for a config it cannot name
        "datamodule_hparams_name": _optional(_STRING),
        "loops": _optional(_record(optional={"train_loader": _optional(_LOADER)})),
        "rng_states": _list_of(_RNG),
        "loggers": _list_of(_record(required={"class": _STRING})),
        "callback_metrics": _mapping_of(_number()),
        "accumulation_step": _COUNT,  # the Accelerator's (save_state)
    }
)
_FILE_FIELDS = _record(
    required={"size": _integer(0, _MAX_FILE_SIZE)},
    optional={"blake3": _digest("blake3"), "sha256": _digest("sha256")},
)


def _file_record(value: Any, source: str, field: str) -> None:
    """A file's size and its digest, named by its algorithm (sha256, or blake3 when opted in)."""
    _FILE_FIELDS(value, source, field)
    if "blake3" not in value and "sha256" not in value:
        raise CheckpointError(f"{source}: field {_join(field, 'sha256')!r} is missing. {_FIX}")


_MANIFEST = _record(
    required={
        "created": _timestamp,
        "world_size": _integer(1, _MAX_WORLD_SIZE),
        "files": _mapping_of(_file_record),
    },
    optional={"epoch": _optional(_COUNT), "global_step": _optional(_COUNT)},
)
_INDEX = _record(
    required={"weight_map": _mapping_of(_STRING)},
    optional={
        "metadata": _record(
            optional={"total_size": _integer(0, _MAX_FILE_SIZE), "aliases": _mapping_of(_STRING)}
        )
    },
)
_LIGHTNING_BATCHES = _record(
    optional={"current": _record(optional={"processed": _COUNT}), "is_last_batch": _BOOLEAN}
)
_LIGHTNING = _record(
    optional={
        "epoch": _COUNT,
        "global_step": _COUNT,
        "loops": _optional(
            _record(
                optional={
                    "fit_loop": _optional(
                        _record(optional={"epoch_loop.batch_progress": _LIGHTNING_BATCHES})
                    )
                }
            )
        ),
    }
)


def check_state(state: Any, *, source: str | Path) -> None:
    """Check the fields of a checkpoint's state (``state.json``, decoded) that are read back.

    Also used for a legacy or Lightning file's dict after conversion. Counters are ints from 0
    to `MAX_COUNT`; ``progress.last_val_step`` is -1 (never validated) up to
    ``progress.global_step``.

    Raises:
        CheckpointError: naming ``source``, the dotted field and the value.
    """
    _STATE(state, str(source), "")
    progress = state.get("progress")
    if progress is not None and progress.get("last_val_step", -1) > progress["global_step"]:
        _refuse(
            str(source),
            "progress.last_val_step",
            progress["last_val_step"],
            f"at most progress.global_step ({progress['global_step']})",
        )


def check_manifest(manifest: Any, *, directory: Path, source: str | Path) -> None:
    """Check a manifest's records (format and version are checked by the reader first).

    Every name in ``files`` must be a relative path inside ``directory``.

    Raises:
        CheckpointError: naming ``source``, the dotted field and the value.
    """
    _MANIFEST(manifest, str(source), "")
    for name in manifest["files"]:
        resolve_inside(directory, name, source=source, field=f"files.{name}")


def check_model_index(
    index: Any, *, directory: Path, source: str | Path, listed: Mapping[str, Any]
) -> list[str]:
    """The shard file names of a ``model.safetensors.index.json``, each checked.

    A shard must be a relative path inside ``directory`` and be listed in the manifest
    (``listed``), so that its digest was checked.

    Raises:
        CheckpointError: naming ``source``, ``weight_map.<tensor>`` and the file name.
    """
    _INDEX(index, str(source), "")
    for tensor_name, shard in index["weight_map"].items():
        field = f"weight_map.{tensor_name}"
        resolve_inside(directory, shard, source=source, field=field)
        if shard not in listed:
            raise CheckpointError(
                f"{source}: field {field!r} names {shard!r}, which the manifest does not list "
                f"(so its digest was never checked). {_FIX}"
            )
    return sorted(set(index["weight_map"].values()))


def check_tensor_aliases(
    aliases: Any, tensors: Mapping[str, torch.Tensor], *, source: str | Path, field: str
) -> dict[str, str]:
    """Tied-weight aliases ``{alias: kept}``, each ``kept`` among the ``tensors`` read."""
    _mapping_of(_STRING)(aliases, str(source), field)
    for alias, kept in aliases.items():
        if kept not in tensors:
            _refuse(str(source), _join(field, alias), kept, "the name of a stored tensor")
    return dict(aliases)


def check_lightning(checkpoint: Any, *, source: str | Path) -> None:
    """Check the loop counters of a PyTorch Lightning checkpoint that are read back.

    Raises:
        CheckpointError: naming ``source``, the dotted field and the value.
    """
    _LIGHTNING(checkpoint, str(source), "")
