"""Reading the pickles inside checkpoints without running code.

A pickle names globals (functions, classes) that the unpickler calls; a ``__reduce__`` payload
names ``os.system`` and runs on load. Two readers here never call a global that is not allowed:

- `load_weights_only`: ``torch.load(weights_only=True)`` (tensors, plain containers, numbers,
  strings) plus the few extra classes a caller names, for files written with ``torch.save``
  (Accelerate's ``*.bin`` / ``*.pkl``, DeepSpeed's ``*.pt``, DCP's byte items).
- `RestrictedUnpickler`: a plain ``pickle`` reader whose ``find_class`` admits only what an
  allow-list function returns, for pickles that are not ``torch.save`` files (DCP's
  ``.metadata``).

Both raise `CheckpointError` naming the file and what was refused. Which globals a format may
use is decided beside that format (``sharded.py``, ``accelerate_folder.py``, ``deepspeed.py``);
this module owns only the mechanism.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterable
from typing import IO, Any

import torch

from trainer.errors import CheckpointError, summarize_error

__all__ = ["RestrictedUnpickler", "load_weights_only", "restricted_loads"]

_FIX = (
    "The file was not written by the framework that owns this format, or it was altered after "
    "it was written (a manifest can be re-hashed): use a checkpoint from a source you trust."
)


def load_weights_only(
    file: str | os.PathLike[str] | IO[bytes],
    *,
    source: str | os.PathLike[str],
    safe_globals: Iterable[Any] = (),
    mmap: bool = False,
) -> Any:
    """``torch.load(file, weights_only=True)`` on CPU, admitting ``safe_globals`` besides torch's.

    Args:
        file: a path or a seekable binary stream written by ``torch.save``.
        source: the file named in the error (the path, or where a stream came from).
        safe_globals: classes/functions this format needs beyond tensors and containers; keep
            them to data classes and enums whose construction runs no code.
        mmap: map the file instead of reading it (zip-format files only).

    Raises:
        CheckpointError: the pickle names another global (it could run code), or is corrupt.
    """
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except EOFError as err:  # no pickle at all: an empty or cut file, not a refused global
        raise CheckpointError(
            f"cannot load {source}: it ends before its content does ({summarize_error(err)}; "
            "an empty or truncated file). Use another checkpoint."
        ) from err
    except (pickle.UnpicklingError, RuntimeError, ValueError, AttributeError) as err:
        raise CheckpointError(
            f"refusing to load {source}: it cannot be read without running code "
            f"({summarize_error(err)}). {_FIX}"
        ) from err


_MALFORMED = (
    pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError,
    IndexError, RuntimeError, NotImplementedError,
)  # fmt: skip


class RestrictedUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that resolves only the globals ``allow`` returns.

    ``allow(module, name)`` returns the object to use, or None to refuse it; a refusal raises
    `CheckpointError` naming ``source`` and the global before anything is called. Persistent
    ids (``torch.save``'s storages) are refused too: such files go through `load_weights_only`.

    Example:
        >>> allow = lambda module, name: set if (module, name) == ("builtins", "set") else None
        >>> RestrictedUnpickler(io.BytesIO(pickle.dumps({1, 2})), source="x", allow=allow).load()
        {1, 2}
    """

    def __init__(
        self,
        file: IO[bytes],
        *,
        source: str | os.PathLike[str],
        allow: Callable[[str, str], object | None],
    ) -> None:
        super().__init__(file)
        self._source = source
        self._allow = allow

    def find_class(self, module: str, name: str) -> Any:
        found = self._allow(module, name)
        if found is None:
            raise CheckpointError(
                f"refusing to load {self._source}: it names the global {module}.{name}, which "
                f"is not one this file may contain (loading it could run code). {_FIX}"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(
            f"refusing to load {self._source}: it holds a persistent id ({str(pid)[:80]}), "
            f"which this file may not contain. {_FIX}"
        )


def restricted_loads(
    data: bytes, *, source: str | os.PathLike[str], allow: Callable[[str, str], object | None]
) -> Any:
    """Unpickle ``data`` with `RestrictedUnpickler`; a malformed pickle is a `CheckpointError`."""
    try:
        return RestrictedUnpickler(io.BytesIO(data), source=source, allow=allow).load()
    except CheckpointError:
        raise
    except _MALFORMED as err:  # an allowed class called with bad arguments, a cut-off file
        raise CheckpointError(
            f"{source} is not a valid pickle of the expected kind ({summarize_error(err)}). {_FIX}"
        ) from err
