"""DCP's file writer with every file hashed as it is written: no second pass over the shards.

A sharded save used to write its shards with ``torch.distributed.checkpoint.save``, then read
every file back to hash it for the manifest (`trainer.checkpoint.rank_hashing`): the whole
checkpoint passed through memory twice, and from disk when the page cache could not hold it.
`HashingFileSystemWriter` is DCP's own ``FileSystemWriter`` (same files, same fsyncs, same
``.metadata``) whose streams feed each byte to the manifest's digest on its way to the file, on
a worker thread (`trainer.checkpoint.tensor_files.Hasher`), so hashing overlaps the write and
its fsync. After the save, `HashingFileSystemWriter.records` holds the manifest record (size,
digest) of every file this process wrote, by name relative to the checkpoint folder.

Not owned: which files a manifest may list, and checking them on load (``manifest.py``,
``rank_hashing.py``); the staging folder and the commit (``sharded.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from trainer.checkpoint.tensor_files import FileRecord, Hasher, default_digest

__all__ = ["HashingFileSystemWriter"]

# A write this small may come from a buffer its writer reuses (torch.save's zip headers): it is
# copied, with the small writes after it, into one buffer the worker thread hashes once it holds
# this much (torch.save makes ~30 tiny writes per tensor; one queue entry each would fill the
# hasher's queue and stall the writer behind a large hash). A larger write is a tensor's own
# storage (DCP keeps each tensor alive until its file is closed) or bytes: hashed in place.
_COPY_BELOW = 1 << 20


class _HashingStream:
    """A binary file opened for writing whose bytes also go to a digest."""

    def __init__(self, file: Any, algorithm: str) -> None:
        self._file = file
        self._algorithm = algorithm
        self._hasher = Hasher(algorithm)
        self._small = bytearray()  # copies of the small writes not yet handed to the hasher
        self._size = 0
        self._record: FileRecord | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self._file.write(view)
        if view.nbytes < _COPY_BELOW:
            self._small += view
            if len(self._small) >= _COPY_BELOW:
                self._hand_over_small()
        else:
            self._hand_over_small()
            self._hasher.update(view)
        self._size += view.nbytes
        return written

    def _hand_over_small(self) -> None:
        if self._small:
            self._hasher.update(self._small)  # the hasher owns it now
            self._small = bytearray()

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # a seek back would make the digest differ from the file

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        self._file.close()

    def record(self) -> FileRecord:
        """The file's manifest record; call it once, after the last write."""
        if self._record is None:
            self._hand_over_small()
            self._record = {"size": self._size, self._algorithm: self._hasher.hexdigest()}
        return self._record


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording a digest for each file written under ``root``."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = Path(root)
        self.records: dict[str, FileRecord] = {}
        self._algorithm = default_digest()

    def _name(self, path: str | os.PathLike[str]) -> str:
        return Path(os.path.relpath(path, self.root)).as_posix()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = self._name(path)
        self.records.pop(name, None)
        with open(path, "wb") as file:
            stream = _HashingStream(file, self._algorithm)
            try:
                yield stream
            finally:
                record = stream.record()  # also ends the worker thread on an error
        self.records[name] = record

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        record = self.records.pop(self._name(path), None)
        if record is not None:
            self.records[self._name(new_path)] = record

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        super().rm_file(path)
        self.records.pop(self._name(path), None)


class HashingFileSystemWriter(FileSystemWriter):
    """``torch.distributed.checkpoint.FileSystemWriter`` that hashes every file it writes.

    Pass it to ``dcp.save(state, storage_writer=writer)``. The files are DCP's, byte for byte;
    `records` then maps each file this process wrote (``"__0_0.distcp"``, and ``".metadata"``
    on the coordinator) to its manifest record, in `default_digest`'s algorithm.

    Args:
        path: the folder DCP writes to; record names are relative to it.
        **kwargs: passed to ``FileSystemWriter``.
    """

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = _HashingFileSystem(Path(path))

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save (DCP calls it first): records start empty; a new ``checkpoint_id`` is the root."""
        super().reset(checkpoint_id)
        if checkpoint_id:
            self.fs.root = Path(checkpoint_id)
        self.fs.records.clear()

    @property
    def records(self) -> dict[str, FileRecord]:
        """Manifest records of the files written so far, by name relative to ``path``."""
        return dict(self.fs.records)
