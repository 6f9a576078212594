"""``trainer checkpoint``: inspect, verify and consolidate checkpoint directories offline.

``trainer checkpoint consolidate DIR OUT`` turns a sharded checkpoint (DCP shards written by
FSDP with ``state_dict_type="SHARDED"``, or DeepSpeed ZeRO shards written by DeepSpeedStrategy)
— or any trainer checkpoint — into one ``model.safetensors``-style file of full weights, without
starting processes.
``trainer checkpoint verify DIR`` checks every file against the manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import CheckpointError

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
    merge.add_argument("output", help="the .safetensors file to write (a new file)")
    merge.add_argument(
        "--force", action="store_true", help="replace OUT when it is an existing file"
    )
    check = actions.add_parser("verify", help="check every file against the manifest")
    check.add_argument("directory")
    return parser


def consolidate(
    directory: str | os.PathLike[str], output: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Write the full model weights of the checkpoint at ``directory`` to ``output``.

    Returns the output path. The checkpoint is verified first. DCP shards are read with
    ``torch.distributed.checkpoint`` in this single process, through the reader that runs no code
    (`trainer.checkpoint.sharded.safe_storage_reader`: ``.metadata`` by an allow-list unpickler,
    byte items with ``weights_only=True``). DeepSpeed ZeRO shards are merged into fp32 weights
    with DeepSpeed's ``zero_to_fp32``, reading DeepSpeed's files with ``weights_only=True``.

    Raises:
        CheckpointError: the checkpoint fails verification, its DCP metadata names a global
            outside the allow-list or a shard outside ``dcp/``, or it holds no model weights;
            ``output`` is a folder (never replaced), lies inside a trainer checkpoint (never
            written: it would break that checkpoint), is an existing file and ``overwrite``
            (``--force``) is False, or the file could not be written. Each is checked before
            the checkpoint is read.
    """
    from trainer.checkpoint.atomic import enclosing_checkpoint, fsync_directory, process_tag
    from trainer.checkpoint.format import load_model_weights, verify_checkpoint
    from trainer.checkpoint.tensor_files import deduplicate, write_safetensors
    from trainer.strategies.full_weights import is_sharded, read_full_weights

    source, target = Path(directory), Path(output)
    _check_output(target, enclosing_checkpoint(target.parent), overwrite=overwrite)
    manifest = verify_checkpoint(source)
    weights = (
        read_full_weights(source)
        if is_sharded(source)
        else load_model_weights(source, manifest["files"])
    )
    tensors, aliases = deduplicate({k: v.contiguous() for k, v in weights.items()})
    metadata = {"format": "pt", "aliases": json.dumps(aliases)}
    # Written beside, then renamed over: an earlier file at `output` survives a failed write.
    staged = target.with_name(f".{target.name}.tmp-{process_tag()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors(str(staged), tensors, metadata)
        os.replace(staged, target)
        fsync_directory(target.parent)
    except OSError as err:
        raise CheckpointError(
            f"trainer checkpoint consolidate: cannot write {str(target)!r}: {err}. Check the "
            "path and its permissions."
        ) from err
    finally:
        with contextlib.suppress(OSError):  # gone once renamed
            staged.unlink()
    return target


def _check_output(target: Path, checkpoint: Path | None, *, overwrite: bool) -> None:
    """Refuse an output that would replace a folder, a file inside a checkpoint
    (``checkpoint``), or, unless ``overwrite``, any existing file."""
    where = "trainer checkpoint consolidate: the output"
    if target.is_dir():  # a folder (or a link to one) is never replaced by the file
        raise CheckpointError(
            f"{where} {str(target)!r} is a folder; it writes one .safetensors file. Name a "
            f"file, e.g. {str(target / 'model.safetensors')!r}."
        )
    if checkpoint is not None:
        raise CheckpointError(
            f"{where} {str(target)!r} is inside the trainer checkpoint {str(checkpoint)!r}, "
            "whose manifest lists every file of it: writing there would break it. Name a file "
            "outside any checkpoint."
        )
    if os.path.lexists(target) and not overwrite:
        raise CheckpointError(
            f"{where} {str(target)!r} exists. Pass --force to replace it, or name a new file."
        )


def run(args: argparse.Namespace) -> int:
    if args.action == "verify":
        from trainer.checkpoint.format import verify_checkpoint
        from trainer.checkpoint.manifest import EXTRA_DIR, allowing_extra_files

        with allowing_extra_files():  # an Accelerator checkpoint's save-hook files are valid
            manifest = verify_checkpoint(args.directory)
        print(
            f"{args.directory}: valid ({len(manifest['files'])} files, global_step {manifest.get('global_step')})"
        )
        if any(name.startswith(f"{EXTRA_DIR}/") for name in manifest["files"]):
            print(
                f"  it holds save-hook files under {EXTRA_DIR}/: an Accelerator checkpoint, "
                "loaded by Accelerator.load_state (Trainer.fit refuses it)"
            )
        return 0
    path = consolidate(args.directory, args.output, overwrite=args.force)
    print(f"consolidated {args.directory} into {path}")
    return 0
