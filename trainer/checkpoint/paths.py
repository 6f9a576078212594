"""Confinement of paths read from untrusted input (a checkpoint, a callback's or logger's state).

Every relative path that comes out of a checkpoint file (``state.json``, ``manifest.json``, a
model index, a restored callback or logger state) goes through `resolve_inside` before it is
opened, listed or deleted: it must be relative, stay inside the folder it belongs to, and not go
through a symbolic link. `refuse_links` checks a whole checkpoint folder once before it is read
(no symbolic link, no named pipe or other special file).
This module owns only those checks; the formats that call them live beside it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainer.errors import CheckpointError, describe

__all__ = ["is_inside", "refuse_links", "resolve_inside"]


def resolve_inside(
    root: str | os.PathLike[str],
    relative: object,
    *,
    source: str | os.PathLike[str],
    field: str,
) -> Path:
    """``root / relative`` as an absolute path, refused unless it stays inside ``root``.

    Args:
        root: the folder the path belongs in (a checkpoint folder, a ``dirpath``, a ``save_dir``).
        relative: the value read from untrusted input: a relative path (str) without ``..``
            parts that leave ``root``, no absolute path, no symbolic link on the way.
        source: the file (or object) the value was read from, named in the error.
        field: the field that held the value, named in the error.

    Returns:
        The absolute path inside ``root`` (it need not exist).

    Raises:
        CheckpointError: ``relative`` is not a non-empty string, is absolute, leaves ``root``, or
            goes through a symbolic link. The message names ``source``, ``field`` and the value.

    Example:
        >>> resolve_inside("/ckpts/step-10", "model.safetensors", source="manifest.json", field="files")
        PosixPath('/ckpts/step-10/model.safetensors')
    """
    where = f"{source}, field {field!r}"
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise CheckpointError(
            f"{where}: expected a non-empty relative path (str), received {describe(relative)}. "
            "The file is corrupt or was not written by trainer; use another checkpoint."
        )
    if os.path.isabs(relative) or (os.altsep and relative.startswith(os.altsep)):
        raise CheckpointError(
            f"{where}: the path {relative!r} is absolute; a checkpoint may only name paths "
            "inside its own folder. Refusing to use it (the file may have been tampered with)."
        )
    base = Path(os.path.abspath(root))
    target = Path(os.path.normpath(base / relative))
    if not is_inside(base, target) or target == base:
        raise CheckpointError(
            f"{where}: the path {relative!r} leaves the folder {str(base)!r}. Refusing to use "
            "it (the file may have been tampered with)."
        )
    current = base
    for part in target.relative_to(base).parts:
        current = current / part
        if current.is_symlink():
            raise CheckpointError(
                f"{where}: the path {relative!r} goes through the symbolic link "
                f"{str(current)!r}. A checkpoint may not contain symbolic links; copy the "
                "real files into the folder instead."
            )
    return target


def is_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether the normalized ``path`` is ``root`` or below it (no filesystem access)."""
    base = os.path.normpath(os.path.abspath(root))
    candidate = os.path.normpath(os.path.abspath(path))
    return candidate == base or candidate.startswith(base.rstrip(os.sep) + os.sep)


def refuse_links(folder: str | os.PathLike[str], *, source: str = "checkpoint") -> None:
    """Refuse a checkpoint folder holding, anywhere below it, a symbolic link or anything that
    is neither a regular file nor a folder (a named pipe, a socket, a device).

    A tar archive can hold a named pipe: opening it to hash or read it would wait forever for a
    writer. Entries are only examined (``lstat``), never opened.

    Raises:
        CheckpointError: naming the entry and what it is (for a link, where it points).
    """
    for directory, subdirectories, files in os.walk(folder):
        for name in [*subdirectories, *files]:
            path = os.path.join(directory, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:  # gone since it was listed: the listing check reports it missing
                continue
            if stat.S_ISLNK(mode):
                raise CheckpointError(
                    f"{source} {str(folder)!r}: {path!r} is a symbolic link (to "
                    f"{os.readlink(path)!r}). A checkpoint may not contain symbolic links: "
                    "its files are read from its own folder only. Copy the real files in."
                )
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise CheckpointError(
                    f"{source} {str(folder)!r}: {path!r} is {_kind(mode)}, not a regular file. "
                    "A checkpoint holds only files and folders (reading it could block forever); "
                    "the folder was altered or unpacked wrongly. Use another checkpoint."
                )


def _kind(mode: int) -> str:
    """What a special entry is, in words, for the refusal."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"
