"""Weights from files that are not checkpoint directories: ``.safetensors``, and legacy pickles.

Legacy ``.ckpt`` / ``.pt`` / ``.pth`` / ``.bin`` files are read with
``torch.load(weights_only=True)`` only, so a pickle that would run code is refused, never run.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.lightning import from_lightning, is_lightning_checkpoint
from trainer.checkpoint.schema import check_state
from trainer.checkpoint.tensor_files import read_safetensors
from trainer.errors import CheckpointError, CheckpointNotFoundError, summarize_error

__all__ = ["LEGACY_SUFFIXES", "load_weights_file"]

LEGACY_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")


def load_weights_file(path: str | os.PathLike[str], device: str = "cpu") -> dict[str, Any]:
    """A checkpoint-like dict from a single file.

    ``.safetensors`` gives ``{"state_dict": tensors}``; a legacy pickle gives its dict as saved
    (a bare state dict is wrapped). A Lightning ``.ckpt`` keeps its weights, optimizer and
    scheduler states, and gets a ``progress`` record from its loop state so that a run resumes
    where Lightning stopped (`trainer.checkpoint.lightning.from_lightning`).

    The fields the Trainer reads back (``progress``, ``optimizer_states``, ...) are checked as
    a checkpoint directory's ``state.json`` is (`trainer.checkpoint.schema.check_state`).

    Raises:
        CheckpointError: unknown suffix, unreadable file, a pickle with anything but tensors
            and plain containers in it, or an invalid field (named with its value).
    """
    file = Path(path)
    if not file.exists():
        raise CheckpointNotFoundError(f"checkpoint file {file} does not exist.")
    if not file.is_file():
        raise CheckpointError(f"checkpoint file {file} is not a file.")
    if file.stat().st_size == 0:
        raise CheckpointError(
            f"checkpoint file {file} is empty (0 bytes): its save did not finish or a copy "
            "failed. Use another checkpoint."
        )
    if file.suffix == ".safetensors":
        try:
            return {"state_dict": read_safetensors(str(file), device)[0]}
        except Exception as err:  # safetensors raises its own SafetensorError on corrupt files
            raise CheckpointError(f"{file} is not a valid safetensors file: {err}") from err
    if file.suffix not in LEGACY_SUFFIXES:
        raise CheckpointError(
            f"cannot load {file}: expected a checkpoint directory, a .safetensors file, or a legacy {'/'.join(LEGACY_SUFFIXES)} file."
        )
    try:
        loaded = torch.load(file, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError) as err:
        raise CheckpointError(
            f"refusing to load {file}: it is not a plain tensor checkpoint that can be read without running code ({summarize_error(err)})."
        ) from err
    if isinstance(loaded, dict) and is_lightning_checkpoint(loaded):
        loaded = from_lightning(loaded, source=file)
    elif isinstance(loaded, dict) and all(isinstance(v, torch.Tensor) for v in loaded.values()):
        loaded = {"state_dict": loaded}  # a bare state dict: its keys are checked below
    elif not isinstance(loaded, dict) or "state_dict" not in loaded:
        raise CheckpointError(f"{file} holds {type(loaded).__name__}, not a state dict.")
    check_state(loaded, source=file)
    return loaded
