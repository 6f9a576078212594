"""Atomic directories and files: build under a temporary sibling, fsync, rename into place.

A crash at any moment leaves either the previous content under the real name or the new one,
never a mixture: readers see a checkpoint only once it is complete. Temporary siblings are named
``.<name>.tmp-<pid>-<host>-<id>`` (``.old-`` once retired); `remove_stale_temporaries` removes
those a killed process left behind. Deciding what to keep (top-k, ``last``) is not done here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import time
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
    "process_tag",
    "refusal_to_replace",
    "remove_stale_temporaries",
]

_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
MANIFEST = "manifest.json"  # every directory written here has one; its presence allows replacing
STALE_AFTER_S = 24 * 3600  # a temporary sibling untouched this long is abandoned, whoever wrote it
# ".<name>.tmp-<pid>-<host>-<id>": the host is absent in names written by earlier versions.
_OWNER = re.compile(r"\.(?:tmp|old)-(\d+)-(?:([A-Za-z0-9.-]+)-)?([0-9a-f]{8})$")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is an unfinished or retired sibling left by `atomic_directory`."""
    return name.startswith(".") and (_TMP_MARK in name or _OLD_MARK in name)


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


def _is_abandoned(entry: os.DirEntry[str], now: float) -> bool:
    """Whether a temporary sibling's writer is gone: a dead process of this host, or old."""
    match = _OWNER.search(entry.name)
    if match is not None and match.group(2) == _host():
        return not _is_alive(int(match.group(1)))
    # Another host's (its pids mean nothing here) or an unnamed owner: only when long untouched.
    return now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary siblings in ``folder`` that a killed save left behind.

    An entry marked by `is_temporary` is removed when its name says it belongs to a process of
    this host that no longer runs, or, whoever wrote it, when it has not been modified for
    ``STALE_AFTER_S`` (a day). A live process's temporary folder is never touched. Errors
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
    tag = process_tag()
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
    temporary = path.parent / f".{path.name}{_TMP_MARK}{process_tag()}"
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
