"""Full model weights of a sharded checkpoint, read in one process without running code.

A checkpoint directory written by FSDP (``state_dict_type="SHARDED"``: DCP shards in ``dcp/``)
or by DeepSpeedStrategy (ZeRO shards in ``deepspeed/``) holds each parameter in pieces, one per
rank. `read_full_weights` merges them here, without starting processes: ``trainer checkpoint
consolidate`` and ``TrainModule.load_from_checkpoint`` build on it. Verify the directory first
(`trainer.checkpoint.verify_checkpoint`); this module reads what the manifest vouched for.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.sharded import DCP_DIR, read_dcp_metadata, safe_storage_reader
from trainer.errors import CheckpointError
from trainer.strategies.deepspeed_checkpoint import ENGINE_DIR, load_engine_weights

__all__ = ["is_sharded", "read_full_weights"]


def is_sharded(directory: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint directory holds its weights as DCP or DeepSpeed shards."""
    source = Path(directory)
    return (source / DCP_DIR).is_dir() or (source / ENGINE_DIR).is_dir()


def read_full_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The full weights of a sharded checkpoint directory (already verified), on the CPU.

    DCP shards are read with ``torch.distributed.checkpoint`` through the reader that runs no
    code (`trainer.checkpoint.sharded.safe_storage_reader`: ``.metadata`` by an allow-list
    unpickler, byte items with ``weights_only=True``). DeepSpeed ZeRO shards are merged into
    fp32 weights with DeepSpeed's ``zero_to_fp32``, its files read with ``weights_only=True``.

    Raises:
        CheckpointError: the directory is not sharded, its DCP metadata names a global outside
            the allow-list or a shard outside ``dcp/``, or the shards hold no model weights.
    """
    source = Path(directory)
    if (source / DCP_DIR).is_dir():
        weights = _dcp_weights(source / DCP_DIR)
        kind = "DCP"
    elif (source / ENGINE_DIR).is_dir():
        weights = load_engine_weights(source)
        kind = "DeepSpeed"
    else:
        raise CheckpointError(f"{source}: not a sharded checkpoint (no {DCP_DIR}/ shards).")
    if not weights:
        raise CheckpointError(f"{source}: the {kind} shards hold no model weights.")
    return weights


def _dcp_weights(dcp_dir: Path) -> Any:
    """The ``model`` entry of the DCP shards in ``dcp_dir``, read in this process, running no code.

    ``.metadata`` is read first with the allow-list unpickler (`read_dcp_metadata`), so a
    payload is refused with its own message before DCP starts; then DCP reads the shards through
    `safe_storage_reader`, never with torch's own reader (which unpickles ``.metadata``).
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    read_dcp_metadata(dcp_dir / ".metadata")
    try:
        with warnings.catch_warnings():  # "no process group: loading in one process" is the point
            warnings.simplefilter("ignore", UserWarning)
            loaded = _load_state_dict_from_keys(storage_reader=safe_storage_reader(dcp_dir))
    except CheckpointException as err:  # DCP wraps each rank's error: give ours back as it is
        failures = getattr(err, "failures", {}) or {}
        for rank in sorted(failures):
            if isinstance(failures[rank][0], CheckpointError):
                raise failures[rank][0] from None
        reason = str(err).strip().splitlines()[-1][:300] if str(err).strip() else repr(err)
        raise CheckpointError(
            f"{dcp_dir}: torch.distributed.checkpoint could not read the shards: {reason}."
        ) from err
    return loaded.get("model")
