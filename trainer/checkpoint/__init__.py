"""Checkpoint files: the directory format, atomic writes, integrity checks, legacy loading."""

from trainer.checkpoint.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    find_latest_checkpoint,
    is_checkpoint_dir,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)
from trainer.checkpoint.legacy import load_weights_file

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "find_latest_checkpoint",
    "is_checkpoint_dir",
    "load_weights_file",
    "read_checkpoint",
    "verify_checkpoint",
    "write_checkpoint",
]
