"""Atomic directories and files: build under a temporary sibling, fsync, rename into place.

A crash at any moment leaves either the previous content under the real name or the new one,
never a mixture: readers see a checkpoint only once it is complete. The same holds when a
checkpoint is deleted (`discard_directory`): it is renamed to a temporary name before its files
are removed, so a crash in the middle never leaves a half-deleted folder under the real name.
Temporary siblings are named ``.<name>.tmp-<pid>-<host>-<id>`` (``.old-`` once retired);
`remove_stale_temporaries` removes those a killed process left behind, and no other entry. A
folder is replaced or deleted as a checkpoint only when `has_trainer_manifest` says trainer wrote
it and it holds nothing its manifest does not list (`unlisted_files`: a user's notes or results).
Deciding what to keep (top-k, ``last``) is not done here.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import stat
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from trainer.errors import CheckpointError

__all__ = [
    "MANIFEST",
    "atomic_directory",
    "atomic_write",
    "atomic_write_text",
    "check_replaceable",
    "discard_checkpoint",
    "discard_directory",
    "enclosing_checkpoint",
    "exchange_paths",
    "fsync_directory",
    "has_trainer_manifest",
    "is_temporary",
    "process_tag",
    "read_small_file",
    "refusal_to_replace",
    "remove_stale_temporaries",
    "replace_directory",
    "shown_names",
    "unlisted_files",
]

_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
MANIFEST = "manifest.json"  # every directory written here has one (`has_trainer_manifest`)
MANIFEST_MAX_BYTES = 16 * 2**20  # a manifest is ~200 bytes a file: 16 MiB is ~80,000 files
STALE_AFTER_S = 24 * 3600  # a temporary sibling untouched this long is abandoned, whoever wrote it
# What follows the last mark of a temporary name, in every form a version of trainer wrote:
_OWNER = re.compile(
    r"\.(?:tmp|old)-(?:"
    r"(\d+)-(?:([A-Za-z0-9.-]+)-)?[0-9a-f]{8}"  # <pid>-<host>-<id>; no host in earlier versions
    r"|(?:dcp|deepspeed)-[0-9a-f]{12}(?:[0-9a-f]{20})?)"  # earlier sharded staging: <engine>-<id>
)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is an unfinished or retired sibling that trainer writes.

    That is ``.<name>.tmp-<pid>-<host>-<id>`` or ``.old-`` (`process_tag`), or a form earlier
    versions wrote (``<pid>-<id>``, and ``<engine>-<id>`` for sharded staging), with ``<id>``
    lowercase hex. Other hidden names holding ``.tmp-`` or ``.old-`` (a user's ``.env.old-2023``
    or ``.venv.old-py310``) are not.

    Example:
        >>> is_temporary(".epoch=0-step=40.tmp-4242-node7-0a1b2c3d"), is_temporary(".env.old-2023")
        (True, False)
    """
    return name.startswith(".") and _owner(name) is not None


def process_tag() -> str:
    """``<pid>-<host>-<random>``: names a temporary sibling after the process that owns it."""
    return f"{os.getpid()}-{_host()}-{uuid.uuid4().hex[:8]}"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "unknown"


def _is_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (in doubt: yes, so nothing live is removed)."""
    if pid == os.getpid() or os.name != "posix":  # os.kill(pid, 0) signals on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # PermissionError: another user's live process
        return True
    return True


def _owner(name: str) -> re.Match[str] | None:
    """The owner part of a temporary name: the one after its last mark.

    A name can hold two marks (``..last.tmp-<tag>.tmp-<tag>``: `last` is staged under a temporary
    name, then written through `atomic_directory`); the host must not swallow the first one.
    """
    start = max(name.rfind(_TMP_MARK), name.rfind(_OLD_MARK))
    if start < 2:  # no mark, or none after ".<name>"
        return None
    return _OWNER.fullmatch(name, start)


def _is_abandoned(entry: os.DirEntry[str], now: float) -> bool:
    """Whether a temporary sibling's writer is gone: a dead process of this host, or old."""
    match = _owner(entry.name)
    if match is not None and match.group(2) == _host():
        return not _is_alive(int(match.group(1)))
    # Another host's (its pids mean nothing here) or an unnamed owner: only when long untouched.
    return now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary siblings in ``folder`` that a killed save left behind.

    Only an entry whose whole name is one trainer writes (`is_temporary`) is considered. It is
    removed when its name says it belongs to a process of this host that no longer runs, or,
    whoever wrote it, when it has not been modified for ``STALE_AFTER_S`` (a day). A live
    process's temporary folder, and any other entry, is never touched. Errors
    (a folder that vanished, permissions) are ignored: another save may be cleaning too.

    Returns:
        The names removed.

    Example:
        >>> remove_stale_temporaries("checkpoints")  # after a save was SIGKILLed
        ['.epoch=0-step=40.tmp-4242-node7-0a1b2c3d']
    """
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not is_temporary(entry.name) or not _is_abandoned(entry, now):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    return removed


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

    An existing ``final`` is replaced when it is empty or a checkpoint (`has_trainer_manifest`), by
    `replace_directory`: one atomic exchange where the OS has it, and the old one removed after.
    On error the temporary directory is removed and ``final`` is untouched.

    Raises:
        CheckpointError: ``final`` holds something else (a file, another tool's folder), or the
            directory could not be created, written or renamed (wraps OSError).
    """
    final = Path(final)
    check_replaceable(final)
    parent = final.parent
    temporary = parent / f".{final.name}{_TMP_MARK}{process_tag()}"
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
        replace_directory(temporary, final)
    except OSError as err:
        shutil.rmtree(temporary, ignore_errors=True)
        raise CheckpointError(
            f"writing checkpoint {final} failed: {err}. The previous checkpoint, if any, is intact."
        ) from err
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def replace_directory(staged: Path, final: Path) -> None:
    """Make the complete directory ``staged`` (a temporary sibling) be ``final``, then drop the old.

    Where the OS has ``renameat2(RENAME_EXCHANGE)`` (Linux) the two names are exchanged in one
    step: ``final`` is never absent and never partial. Elsewhere (not Linux, some network file
    systems) the old one is renamed aside first (``.<name>.old-...``): for a moment ``final`` is
    absent, and a crash right then leaves both under temporary names (resume picks the newest
    checkpoint; the next save removes them). The replaced entry (a checkpoint folder, a link or a
    small file) is removed last, from its temporary name.

    Raises:
        OSError: a rename failed; ``final`` then still holds what it held before.
    """
    if not os.path.lexists(final):
        os.rename(staged, final)
        fsync_directory(final.parent)
        return
    if exchange_paths(staged, final):
        fsync_directory(final.parent)
        _remove_entry(staged)  # now the old one
        return
    if _TMP_MARK in staged.name:
        retired = staged.with_name(staged.name.replace(_TMP_MARK, _OLD_MARK, 1))
    else:
        retired = final.with_name(f".{final.name}{_OLD_MARK}{process_tag()}")
    os.rename(final, retired)
    try:
        os.rename(staged, final)
    except OSError:
        with contextlib.suppress(OSError):
            os.rename(retired, final)  # put the previous one back
        raise
    fsync_directory(final.parent)
    _remove_entry(retired)


def discard_directory(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint directory without ever leaving part of it under its name.

    It is first renamed to a temporary sibling (``.<name>.old-<pid>-<host>-<id>``, one atomic
    step, made durable), and only then are its files removed. A crash in between leaves a
    temporary folder that resume ignores and `remove_stale_temporaries` removes. A path that is
    already gone is ignored.
    """
    path = Path(path)
    retired = path.with_name(f".{path.name}{_OLD_MARK}{process_tag()}")
    try:
        os.rename(path, retired)
    except OSError:
        return  # gone already (another process rotated it), or not ours to move
    with contextlib.suppress(OSError):
        fsync_directory(path.parent)
    _remove_entry(retired)


def exchange_paths(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Atomically exchange two paths (Linux renameat2); False where that is unsupported.

    Raises:
        OSError: the call is supported but failed (a path is missing, permissions, ...).
    """
    if sys.platform != "linux":
        return False
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28
    if function is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if function(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


def _remove_entry(path: Path) -> None:
    """Remove a temporary or replaced entry of any kind (folder, file, link); errors ignored."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(OSError):
            os.unlink(path)


def read_small_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file ``path``, read without following a link or blocking.

    A named pipe would block a plain ``open`` forever and a device could be endless: the file
    is opened without waiting and without following a final symbolic link, and only then checked.

    Raises:
        OSError: ``path`` is missing or a symbolic link, is not a regular file, or holds more
            than ``limit`` bytes.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        data = file.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data


def has_trainer_manifest(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a ``manifest.json`` that trainer wrote: the test that lets a
    folder be replaced or deleted as a checkpoint.

    The manifest must be a regular file (no link, no pipe) of at most `MANIFEST_MAX_BYTES`, and
    a JSON object whose ``"format"`` is ``"trainer-checkpoint"`` (every version has written
    that). Its files are not verified: this says whose folder it is, not that it is intact. A
    dataset's or a web app's ``manifest.json`` does not make its folder a checkpoint.

    Example:
        >>> has_trainer_manifest("checkpoints/epoch=0-step=40"), has_trainer_manifest("my_pwa")
        (True, False)
    """
    return _trainer_manifest(folder) is not None


def _trainer_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest trainer wrote in ``folder`` (see `has_trainer_manifest`), unchecked, or None."""
    from trainer.checkpoint.manifest import FORMAT_NAME  # manifest.py imports this module

    try:
        manifest = json.loads(read_small_file(Path(folder) / MANIFEST, MANIFEST_MAX_BYTES))
    except (OSError, ValueError, RecursionError):  # missing, special, too large, not JSON
        return None
    if isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME:
        return manifest
    return None


def unlisted_files(folder: str | os.PathLike[str]) -> list[str]:
    """What a user added to the checkpoint ``folder``: entries its manifest does not list.

    Names are relative and "/"-separated; a symbolic link counts as an entry (it is not
    followed), an empty subfolder does not. A folder holding such files is not trainer's alone:
    it is neither deleted (top-k rotation, ``total_limit``) nor replaced (``last``). A folder
    without a trainer manifest yields [] (whether it may be touched is `has_trainer_manifest`'s
    question).

    Example:
        >>> unlisted_files("checkpoints/epoch=0-step=40")  # after the user wrote eval.txt there
        ['eval.txt']
    """
    manifest = _trainer_manifest(folder)
    listed = manifest.get("files") if manifest is not None else None
    if not isinstance(listed, dict):
        return []
    found = []
    for root, folders, names in os.walk(folder):
        links = [name for name in folders if os.path.islink(os.path.join(root, name))]
        for name in names + links:
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if relative != MANIFEST and relative not in listed:
                found.append(relative)
    return sorted(found)


def shown_names(names: list[str], limit: int = 4) -> str:
    """``names`` joined for a message, the first ``limit`` of them then "..."."""
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def discard_checkpoint(path: str | os.PathLike[str], owner: str) -> bool:
    """`discard_directory` for a checkpoint trainer wrote, unless a user added files to it.

    A folder with `unlisted_files` is kept, with a warning naming ``owner`` (who wanted it
    gone) and the files; it is then no longer tracked by ``owner``. Returns whether it was
    discarded.
    """
    added = unlisted_files(path)
    if added:
        warnings.warn(
            f"{owner}: {os.fspath(path)!r} would be deleted as an old checkpoint, but it holds "
            f"files its manifest does not list ({shown_names(added)}): kept, and no longer "
            "tracked. Move those files out and delete the folder when you no longer need it.",
            stacklevel=3,
        )
        return False
    discard_directory(path)
    return True


def enclosing_checkpoint(path: str | os.PathLike[str]) -> Path | None:
    """The trainer checkpoint folder ``path`` is or lies inside (links resolved), or None.

    A file written there would break the checkpoint: its manifest lists every file of it.
    """
    resolved = Path(path).resolve()
    return next((f for f in (resolved, *resolved.parents) if has_trainer_manifest(f)), None)


def refusal_to_replace(final: Path) -> str | None:
    """Why a checkpoint may not be written at ``final``, or None when it may.

    It may when nothing is there, or a link, an empty folder or a checkpoint
    (`has_trainer_manifest`) holding only the files its manifest lists (`unlisted_files`).
    """
    if final.is_symlink() or not final.exists():  # replacing a link deletes no data
        return None
    added = unlisted_files(final)
    if final.is_dir() and not added and (has_trainer_manifest(final) or not any(final.iterdir())):
        return None
    if added:
        what = (
            f"a checkpoint holding files its manifest does not list ({shown_names(added)}; "
            "added after it was saved)"
        )
    elif final.is_dir():
        names = sorted(entry.name for entry in final.iterdir())
        why = f"its {MANIFEST} is not trainer's" if MANIFEST in names else f"no {MANIFEST}"
        what = f"a folder that is not a checkpoint (it holds {shown_names(names)}; {why})"
    else:
        what = "a file"
    return (
        f"refusing to write a checkpoint at {final}: it is {what}, and replacing it would delete "
        "it. Choose another path, or move it away first."
    )


def check_replaceable(final: Path) -> None:
    """Raise unless a checkpoint may be written at ``final`` (see `refusal_to_replace`).

    Raises:
        CheckpointError: ``final`` is a file, or a folder with content and no manifest that
            trainer wrote.
    """
    refusal = refusal_to_replace(final)
    if refusal is not None:
        raise CheckpointError(refusal)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace a small file's content atomically (temporary file, fsync, rename)."""
    atomic_write(path, lambda file: file.write(text.encode("utf-8")))


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], Any]) -> None:
    """Create or replace the file ``path`` with what ``write`` writes to the open (binary) file,
    atomically: a temporary file beside it, fsynced, renamed over it, the folder fsynced. A
    crash leaves the old file or the new one, never part of one.

    Raises:
        CheckpointError: the file could not be written (the temporary file is removed).
    """
    path = Path(path)
    temporary = path.parent / f".{path.name}{_TMP_MARK}{process_tag()}"
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        fsync_directory(path.parent)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(err, OSError):
            raise CheckpointError(f"writing {path} failed: {err}") from err
        raise
