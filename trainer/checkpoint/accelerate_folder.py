"""Reading a folder written by Hugging Face Accelerate's ``save_state``, for ``load_state``.

Accelerate writes one file per object: ``model.safetensors`` (or ``pytorch_model.bin``),
``model_1.safetensors`` ..., ``optimizer.bin``, ``optimizer_1.bin`` ..., ``scheduler.bin`` ...,
``custom_checkpoint_0.pkl`` ... and ``random_states_<process>.pkl``, all but the safetensors
written with ``torch.save``. :func:`read_accelerate_folder` reads them into the checkpoint dict
that ``Accelerator.load_state`` restores. Every pickle is read with ``weights_only=True``; the RNG
file also needs numpy's array reconstruction, which is allowed for that file only.

Not read (a warning names them): ``scaler.pt`` and ``sampler*.bin`` / ``dl_state_dict*.bin``
(the loss scale and the loader position restart), and FSDP/DeepSpeed sub-folders (consolidate
those with Accelerate first).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.atomic import has_trainer_manifest
from trainer.checkpoint.legacy import load_weights_file
from trainer.checkpoint.safe_unpickle import load_weights_only
from trainer.checkpoint.schema import check_state
from trainer.errors import CheckpointError, describe

__all__ = ["is_accelerate_folder", "read_accelerate_folder"]

_MARKERS = ("optimizer.bin", "random_states_0.pkl", "model.safetensors", "pytorch_model.bin")
_NOT_READ = re.compile(r"^(scaler\.pt|sampler(_\d+)?\.bin|dl_state_dict(_\d+)?\.bin)$")
# Accelerate's random_states_<i>.pkl keys -> get_rng_states' (others, such as XLA's, not read)
_RNG_KEYS = {
    "random_state": "python",
    "numpy_random_seed": "numpy",
    "torch_manual_seed": "torch",
    "torch_cuda_manual_seed": "cuda",
}


def is_accelerate_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder Accelerate's ``save_state`` wrote (and not our checkpoint)."""
    folder = Path(path)
    return (
        folder.is_dir()
        and not has_trainer_manifest(folder)
        and any((folder / name).is_file() for name in _MARKERS)
    )


def read_accelerate_folder(path: str | Path, process_index: int) -> dict[str, Any]:
    """The checkpoint dict ``load_state`` restores, from Accelerate's files in ``path``.

    Raises:
        CheckpointError: a file cannot be read without running code, an RNG state is not one
            (checked here, before anything is loaded), or the folder holds an engine's sharded
            state (``pytorch_model_fsdp_*``, DeepSpeed tags).
    """
    folder = Path(path)
    sharded = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if sharded:
        raise CheckpointError(
            f"{folder} holds Accelerate engine folders ({', '.join(sharded)}): sharded "
            "FSDP/DeepSpeed states are not read. Merge them with `accelerate merge-weights`, "
            "or finish that run with Accelerate."
        )
    models = _numbered(folder, ("model{}.safetensors", "pytorch_model{}.bin"), _weights)
    ignored = sorted(p.name for p in folder.iterdir() if _NOT_READ.match(p.name))
    if ignored:
        warnings.warn(
            f"load_state({folder}): {', '.join(ignored)} not read (loss scale and loader "
            "position restart from their current values).",
            stacklevel=4,
        )
    return {
        "state_dict": models[0] if models else {},
        "other_models": models[1:],
        "num_models": len(models),
        "optimizer_states": _numbered(folder, ("optimizer{}.bin",), _pickle),
        "lr_schedulers": _numbered(folder, ("scheduler{}.bin",), _pickle),
        "custom_objects": _custom_objects(folder),
        **_random_states(folder, process_index),
    }


def _numbered(folder: Path, patterns: tuple[str, ...], read: Any) -> list[Any]:
    """Accelerate's ``name.ext``, ``name_1.ext``, ``name_2.ext`` ... in order, until one is missing."""
    found = []
    for index in range(1_000_000):
        suffix = "" if index == 0 else f"_{index}"
        files = [folder / pattern.format(suffix) for pattern in patterns]
        existing = next((file for file in files if file.is_file()), None)
        if existing is None:
            return found
        found.append(read(existing))
    return found


def _weights(file: Path) -> dict[str, torch.Tensor]:
    return load_weights_file(file)["state_dict"]


def _pickle(file: Path, safe_globals: list[Any] | None = None) -> Any:
    """A ``torch.save`` file read with ``weights_only=True`` (never plain pickle)."""
    return load_weights_only(file, source=file, safe_globals=safe_globals or ())


def _custom_objects(folder: Path) -> list[Any]:
    states = []
    while (file := folder / f"custom_checkpoint_{len(states)}.pkl").is_file():
        states.append(_pickle(file))
    return states


def _random_states(folder: Path, process_index: int) -> dict[str, Any]:
    """Accelerate's ``random_states_<i>.pkl`` for this process: ``rng_states`` in
    ``get_rng_states``' keys (one entry, or none) and its accumulation ``step``."""
    file = folder / f"random_states_{process_index}.pkl"
    if not file.is_file():
        return {"rng_states": []}
    import numpy as np

    array_globals = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _reconstruct(np)]
    saved = _pickle(file, array_globals)
    if not isinstance(saved, dict):
        raise CheckpointError(
            f"{file}: expected the dict of RNG states Accelerate's save_state writes (keys "
            f"{', '.join(_RNG_KEYS)}); received {describe(saved)}. The file is corrupt or was "
            "replaced; delete it to keep the current RNG states, or use another checkpoint."
        )
    state = {ours: saved[theirs] for theirs, ours in _RNG_KEYS.items() if theirs in saved}
    for theirs, ours in _RNG_KEYS.items():  # the checks our own format's states get
        if theirs in saved:
            check_state({"rng_states": [{ours: saved[theirs]}]}, source=f"{file}[{theirs!r}]")
    found: dict[str, Any] = {"rng_states": [state]}
    if "step" in saved:
        check_state({"accumulation_step": saved["step"]}, source=f"{file}['step']")
        found["accumulation_step"] = saved["step"]
    return found


def _reconstruct(np: Any) -> Any:
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core to numpy._core
    return core.multiarray._reconstruct  # noqa: SLF001 - what numpy arrays pickle as
