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

__all__ = [
    "MANIFEST",
    "atomic_directory",
    "atomic_write_text",
    "check_replaceable",
    "fsync_directory",
    "is_temporary",
    "refusal_to_replace",
]

_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
MANIFEST = "manifest.json"  # every directory written here has one; its presence allows replacing


def is_temporary(name: str) -> bool:
    """Whether ``name`` is an unfinished or retired sibling left by `atomic_directory`."""
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

    An existing ``final`` is replaced when it is empty or a checkpoint (it has a manifest): it
    is renamed aside, the new one renamed in, then the old one removed. On error the temporary
    directory is removed and ``final`` is untouched.

    Raises:
        CheckpointError: ``final`` holds something else (a file, another tool's folder), or the
            directory could not be created, written or renamed (wraps OSError).
    """
    final = Path(final)
    check_replaceable(final)
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


def refusal_to_replace(final: Path) -> str | None:
    """Why a checkpoint may not be written at ``final``, or None when it may.

    It may when nothing is there, or a link, an empty folder or a checkpoint (it has a manifest).
    """
    if final.is_symlink() or not final.exists():  # replacing a link deletes no data
        return None
    if final.is_dir() and ((final / MANIFEST).is_file() or not any(final.iterdir())):
        return None
    if final.is_dir():
        names = sorted(entry.name for entry in final.iterdir())
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        what = f"a folder that is not a checkpoint (it holds {shown}; no {MANIFEST})"
    else:
        what = "a file"
    return (
        f"refusing to write a checkpoint at {final}: it is {what}, and replacing it would delete "
        "it. Choose another path, or move it away first."
    )


def check_replaceable(final: Path) -> None:
    """Raise unless a checkpoint may be written at ``final`` (see `refusal_to_replace`).

    Raises:
        CheckpointError: ``final`` is a file, or a folder with content and no manifest.
    """
    refusal = refusal_to_replace(final)
    if refusal is not None:
        raise CheckpointError(refusal)


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
