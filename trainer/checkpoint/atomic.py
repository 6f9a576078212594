"""Atomic directories and files: build under a temporary sibling, fsync, rename into place.

A crash at any moment leaves either the previous content under the real name or the new one,
never a mixture: readers see a checkpoint only once it is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from trainer.errors import CheckpointError

__all__ = ["atomic_directory", "atomic_write_text", "fsync_directory", "is_temporary"]

_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"


def is_temporary(name: str) -> bool:
    """Whether ``name`` is an unfinished or retired sibling left by :func:`atomic_directory`."""
    return name.startswith(".") and (_TMP_MARK in name or _OLD_MARK in name)


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``final`` when the block ends without error.

    An existing ``final`` is replaced: it is renamed aside, the new one renamed in, then the old
    one removed. On error the temporary directory is removed and ``final`` is untouched.

    Raises:
        CheckpointError: the directory could not be created, written or renamed (wraps OSError).
    """
    final = Path(final)
    parent = final.parent
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temporary = parent / f".{final.name}{_TMP_MARK}{tag}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
    except OSError as err:
        raise CheckpointError(
            f"cannot create a checkpoint under {parent}: {err}. Check the path and its permissions."
        ) from err
    try:
        yield temporary
        fsync_directory(temporary)
        retired = None
        if final.exists():
            retired = parent / f".{final.name}{_OLD_MARK}{tag}"
            os.rename(final, retired)
        os.rename(temporary, final)
        fsync_directory(parent)
    except OSError as err:
        shutil.rmtree(temporary, ignore_errors=True)
        raise CheckpointError(
            f"writing checkpoint {final} failed: {err}. The previous checkpoint, if any, is intact."
        ) from err
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace a small file's content atomically (temporary file, fsync, rename)."""
    path = Path(path)
    temporary = path.parent / f".{path.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        fsync_directory(path.parent)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise CheckpointError(f"writing {path} failed: {err}") from err
