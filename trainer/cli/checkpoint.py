"""``trainer checkpoint``: inspect, verify and consolidate checkpoint directories offline.

``trainer checkpoint consolidate DIR OUT`` turns a sharded checkpoint (DCP shards written by
FSDP with ``state_dict_type="SHARDED"``, or DeepSpeed ZeRO shards written by DeepSpeedStrategy)
— or any trainer checkpoint — into one ``model.safetensors``-style file of full weights, without
starting processes.
``trainer checkpoint verify DIR`` checks every file against the manifest.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "consolidate", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``checkpoint`` with its ``consolidate`` and ``verify`` actions."""
    parser = subparsers.add_parser(
        "checkpoint", help="verify or consolidate checkpoint directories", description=__doc__
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    merge = actions.add_parser(
        "consolidate", help="merge shards into one safetensors file of full weights"
    )
    merge.add_argument("directory", help="a checkpoint directory")
    merge.add_argument("output", help="the .safetensors file to write")
    check = actions.add_parser("verify", help="check every file against the manifest")
    check.add_argument("directory")
    return parser


def consolidate(directory: str | os.PathLike[str], output: str | os.PathLike[str]) -> Path:
    """Write the full model weights of the checkpoint at ``directory`` to ``output``.

    Returns the output path. The checkpoint is verified first. DCP shards are read with
    ``torch.distributed.checkpoint`` in this single process, through the reader that runs no code
    (`trainer.checkpoint.sharded.safe_storage_reader`: ``.metadata`` by an allow-list unpickler,
    byte items with ``weights_only=True``). DeepSpeed ZeRO shards are merged into fp32 weights
    with DeepSpeed's ``zero_to_fp32``, reading DeepSpeed's files with ``weights_only=True``.

    Raises:
        CheckpointError: the checkpoint fails verification, its DCP metadata names a global
            outside the allow-list or a shard outside ``dcp/``, or it holds no model weights.
    """
    from trainer.checkpoint.format import load_model_weights, verify_checkpoint
    from trainer.checkpoint.tensor_files import deduplicate, write_safetensors
    from trainer.errors import CheckpointError
    from trainer.strategies.deepspeed import ENGINE_DIR, load_engine_weights
    from trainer.strategies.fsdp import DCP_DIR

    source = Path(directory)
    manifest = verify_checkpoint(source)
    if (source / DCP_DIR).is_dir():
        weights = _dcp_weights(source / DCP_DIR)
        if not weights:
            raise CheckpointError(f"{source}: the DCP shards hold no model weights.")
    elif (source / ENGINE_DIR).is_dir():
        weights = load_engine_weights(source)
        if not weights:
            raise CheckpointError(f"{source}: the DeepSpeed shards hold no model weights.")
    else:
        weights = load_model_weights(source, manifest["files"])
    tensors, aliases = deduplicate({k: v.contiguous() for k, v in weights.items()})
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    import json

    write_safetensors(str(target), tensors, {"format": "pt", "aliases": json.dumps(aliases)})
    return target


def _dcp_weights(dcp_dir: Path) -> Any:
    """The ``model`` entry of the DCP shards in ``dcp_dir``, read in this process, running no code.

    ``.metadata`` is read first with the allow-list unpickler (`read_dcp_metadata`), so a
    payload is refused with its own message before DCP starts; then DCP reads the shards through
    `safe_storage_reader`, never with torch's own reader (which unpickles ``.metadata``).
    """
    import warnings

    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    from trainer.checkpoint.sharded import read_dcp_metadata, safe_storage_reader
    from trainer.errors import CheckpointError

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


def run(args: argparse.Namespace) -> int:
    if args.action == "verify":
        from trainer.checkpoint.format import verify_checkpoint

        manifest = verify_checkpoint(args.directory)
        print(
            f"{args.directory}: valid ({len(manifest['files'])} files, global_step {manifest.get('global_step')})"
        )
        return 0
    path = consolidate(args.directory, args.output)
    print(f"consolidated {args.directory} into {path}")
    return 0
