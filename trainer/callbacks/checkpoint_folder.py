"""What ModelCheckpoint may do to the entries of its ``dirpath``, trusting nothing it finds there.

This module owns the checks behind ModelCheckpoint's changes to disk: the state a resumed run
restores (each field's type checked, each path confined to ``dirpath`` and required to be a
checkpoint before it is tracked), deleting a checkpoint that left the top k (only a real
checkpoint folder inside ``dirpath``), and swapping a complete copy in as ``last`` (refusing a
foreign folder there). It does not decide when to save, what to keep or which checkpoint is best
(``model_checkpoint.py``), nor how a folder is written, confined or replaced atomically
(``trainer/checkpoint/atomic.py``, ``trainer/checkpoint/paths.py``).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint.atomic import (
    MANIFEST,
    atomic_write_text,
    discard_checkpoint,
    has_trainer_manifest,
    process_tag,
    read_small_file,
    refusal_to_replace,
    replace_directory,
)
from trainer.checkpoint.paths import is_inside, resolve_inside
from trainer.errors import CheckpointError, ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.plugins import PendingSave
    from trainer.trainer.trainer import Trainer

__all__ = [
    "adopt_path",
    "checked_state",
    "delete_checkpoint",
    "is_link_left_behind",
    "is_same_path",
    "refusal_for_last",
    "swap_in_last",
    "write_last",
]

_LINK_TEXT_MAX = 4096  # at most this long, a `last` file may be a link flattened by a copy tool


def is_same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same entry once made absolute and normalised."""
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


# ---- restoring -----------------------------------------------------------------------------------
def checked_state(state: object, key: str) -> dict[str, Any]:
    """``state`` with each field's type checked (a checkpoint is untrusted input)."""

    def refuse(field: str, value: object, expected: str) -> CheckpointError:
        return CheckpointError(
            f"ModelCheckpoint state ({key}), field {field!r}: expected {expected}, received "
            f"{describe(value)}. The checkpoint is corrupt or was not written by this "
            "ModelCheckpoint; resume from another checkpoint."
        )

    if not isinstance(state, dict):
        raise refuse("<state>", state, "a dict")
    checks: dict[str, tuple[Any, str]] = {
        "dirpath": (lambda v: v is None or isinstance(v, str), "a str or None"),
        "best_model_path": (lambda v: isinstance(v, str), "a str"),
        "last_model_path": (lambda v: isinstance(v, str), "a str"),
        "best_model_score": (lambda v: v is None or _is_number(v), "a number or None"),
        "saved": (
            lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v),
            "a list of str",
        ),
        "best_k_models": (
            lambda v: (
                isinstance(v, dict)
                and all(isinstance(p, str) and _is_number(s) for p, s in v.items())
            ),
            "a dict of str paths to numbers",
        ),
        "last_saved_step": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
        "kth_best_model_path": (lambda v: isinstance(v, str), "a str"),
        "kth_value": (_is_number, "a number"),
        "current_score": (lambda v: v is None or _is_number(v), "a number or None"),
    }
    for field, (is_valid, expected) in checks.items():
        if field in state and not is_valid(state[field]):
            raise refuse(field, state[field], expected)
    return state


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def adopt_path(field: str, path: str, *, saved_dirpath: str, dirpath: str, source: str) -> str:
    """``path`` (from a checkpoint) as a checkpoint folder in ``dirpath``, or "" (dropped).

    ``path`` must lie inside ``saved_dirpath`` (the folder it was saved in); it is looked up by
    its name relative to that folder in ``dirpath`` (so a copied or moved run keeps its ranking).
    A folder that is gone is dropped; one without a manifest trainer wrote
    (`has_trainer_manifest`) is dropped with a warning; a ``last_model_path`` that is an earlier
    version's link (`is_link_left_behind`) is dropped, since the next save replaces it.

    Raises:
        CheckpointError: ``path`` leaves ``saved_dirpath``, or its counterpart in ``dirpath``
            goes through a symbolic link or ``..``; the message names ``source`` and ``field``.
    """
    if not path:
        return ""
    if not is_inside(saved_dirpath, path) or is_same_path(saved_dirpath, path):
        raise CheckpointError(
            f"{source}, field {field!r}: the path {path!r} is outside the checkpoint folder "
            f"{saved_dirpath!r}. Refusing to track it (rotation would delete it); the "
            "checkpoint may have been tampered with. Resume from another checkpoint."
        )
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(saved_dirpath))
    if field == "last_model_path" and is_link_left_behind(Path(dirpath, relative)):
        return ""  # how earlier versions kept `last`: replaced at the next save, never tracked
    target = resolve_inside(dirpath, relative, source=source, field=field)
    if not target.is_dir():
        return ""  # deleted since (rotated out, removed by hand)
    if not has_trainer_manifest(target):
        warnings.warn(
            f"{source}, field {field!r}: {str(target)!r} is not a checkpoint (no {MANIFEST} "
            "written by trainer); "
            "it is no longer tracked and will not be deleted.",
            stacklevel=2,
        )
        return ""
    return str(target)


# ---- changing ------------------------------------------------------------------------------------
def delete_checkpoint(path: str, dirpath: str) -> None:
    """Remove ``path`` only if it is a checkpoint folder (no link, `has_trainer_manifest`)
    inside ``dirpath``, and keep it with a warning when a user added files to it
    (`discard_checkpoint`)."""
    folder = Path(path)
    if (
        is_inside(dirpath, folder)
        and not is_same_path(dirpath, path)
        and not folder.is_symlink()
        and has_trainer_manifest(folder)
    ):
        # Renamed to a temporary name first: a crash mid-removal leaves no half checkpoint.
        discard_checkpoint(folder, "ModelCheckpoint")


def is_link_left_behind(path: Path) -> bool:
    """Whether ``path`` is how earlier versions kept ``last``, so replacing it deletes nothing.

    That is a symbolic link (to the newest checkpoint's name), or the same link flattened by a
    copy or archive tool: a regular file of at most 4,096 bytes whose whole content is that
    name, optionally followed by one newline, naming a checkpoint folder beside it
    (`has_trainer_manifest`). Any other file (a user's notes called ``last``) is not.
    """
    if path.is_symlink():
        return True
    try:
        text = read_small_file(path, _LINK_TEXT_MAX).decode("utf-8")
    except (OSError, UnicodeDecodeError):  # missing, a folder, special, large, not text
        return False
    name = text.removesuffix("\n")
    if name in ("", ".", "..") or any(char in name for char in "/\\\n\r\x00"):
        return False
    target = path.parent / name
    return not target.is_symlink() and target.is_dir() and has_trainer_manifest(target)


def refusal_for_last(final: Path) -> str | None:
    """Why ``last`` may not be replaced, or None (an earlier version's link or flattened link,
    `is_link_left_behind`; a checkpoint; nothing)."""
    if not os.path.lexists(final) or is_link_left_behind(final):
        return None
    return refusal_to_replace(final)


def write_last(
    trainer: Trainer, final: Path, pending: PendingSave | None, *, weights_only: bool
) -> PendingSave | None:
    """Write the current state again as ``final`` (``last``), swapped in with no moment without it.

    Every process writes (a sharded save is collective) to a temporary name that process 0
    chooses; process 0 then exchanges it with the existing ``last`` (a checkpoint, or an old
    symbolic link or flattened link) and removes what it replaced. A background save
    (``pending``) writes its snapshot there too, and the swap waits until both are complete.

    Raises:
        CheckpointError: ``final`` is a folder that is not a checkpoint, or a file that is not
            a flattened link (`is_link_left_behind`).
    """
    name, refusal = trainer.strategy.broadcast(
        (f".{final.name}.tmp-{process_tag()}", refusal_for_last(final))
        if trainer.is_global_zero
        else None
    )
    if refusal is not None:
        raise CheckpointError(refusal)
    staged = final.parent / name
    if pending is not None:
        pending.also_write(staged)
    else:
        pending = trainer.save_checkpoint(staged, weights_only=weights_only)

    def swap() -> None:
        if trainer.is_global_zero:  # the others wrote their part; process 0 exchanges
            swap_in_last(staged, final)

    if pending is None:
        swap()
        trainer.strategy.barrier()
        return None
    pending.then(swap)
    return pending


def swap_in_last(staged: Path, final: Path) -> None:
    """Make the complete ``staged`` copy be ``final`` (``last``) in one atomic exchange.

    Raises:
        CheckpointError: the exchange failed; ``staged`` is removed and the previous ``last``,
            if any, is intact.
    """
    try:
        replace_directory(staged, final)  # one atomic exchange where the OS has it
    except OSError as err:
        _remove(staged)
        raise CheckpointError(
            f"ModelCheckpoint: replacing {str(final)!r} failed: {err}. The previous "
            "`last`, if any, is intact."
        ) from err


def _remove(path: Path) -> None:
    """Remove a temporary or replaced entry of any kind (folder, file, link)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def local_dirpath(dirpath: str | os.PathLike[str] | None) -> str | None:
    """``dirpath`` made absolute with ``~`` expanded, as Lightning does for local paths."""
    if dirpath is None:
        return None
    path = os.fspath(dirpath)
    return path if "://" in path else os.path.realpath(os.path.expanduser(path))


def write_best_k_yaml(
    best_k_models: dict[str, Any],
    filepath: str | os.PathLike[str] | None,
    dirpath: str | None,
) -> None:
    """``ModelCheckpoint.to_yaml``: the kept checkpoints' scores as ``{path: number}`` YAML.

    Raises:
        ConfigurationError: no ``filepath`` and the callback has no ``dirpath`` yet.
        CheckpointError: the file could not be written.
    """
    import yaml

    if filepath is None:
        if dirpath is None:
            raise ConfigurationError(
                "ModelCheckpoint.to_yaml(): the callback has no dirpath yet (it is set when fit "
                "starts); pass filepath=."
            )
        filepath = os.path.join(dirpath, "best_k_models.yaml")
    scores = {str(path): float(score) for path, score in best_k_models.items()}
    atomic_write_text(filepath, yaml.safe_dump(scores))
