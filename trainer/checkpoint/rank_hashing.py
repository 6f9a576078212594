"""The digests of a sharded checkpoint's files, computed by every rank for its share.

A sharded save writes one shard file (or several) per rank. Hashing them all on rank 0 makes
the save's commit grow with the world size, and verifying them all on every rank before a load
reads the whole checkpoint once per rank. On save, each rank hashes the files it writes as it
writes them (`trainer.checkpoint.dcp_hashing`) and rank 0 writes the manifest from everybody's
records; files no rank recorded are split between the ranks by size (`split_by_size`, the same
split on every rank) and each rank hashes its share (`hash_staged_share`);
on load each rank checks its share against the manifest and the ranks agree before anything
is read (`verified_share`, `agree_or_raise`). A corrupt file is still refused, on every rank, naming the file.
The ranks must see one file system (as DCP's own writer and reader assume).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from trainer.checkpoint.format import read_checkpoint
from trainer.checkpoint.manifest import list_files, read_manifest
from trainer.checkpoint.tensor_files import hash_file
from trainer.errors import CheckpointError

__all__ = [
    "RankGroup",
    "agree_or_raise",
    "gather_or_raise",
    "hash_staged_share",
    "read_checkpoint_by_shares",
    "split_by_size",
    "verified_share",
]

_T = TypeVar("_T")


class RankGroup(Protocol):
    """What the helpers use of a strategy: this rank, the world size, one collective."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


def split_by_size(sizes: Mapping[str, int], parts: int) -> list[list[str]]:
    """``parts`` lists of names with about equal total size (largest first, to the lightest).

    Deterministic: the same ``sizes`` give the same split on every rank.
    """
    shares: list[list[str]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        lightest = totals.index(min(totals))
        shares[lightest].append(name)
        totals[lightest] += sizes[name]
    return shares


def gather_or_raise(group: RankGroup, work: Callable[[], _T]) -> list[_T]:
    """Run ``work`` on every rank and return every rank's result (one collective).

    Raises:
        CheckpointError: on every rank, the first rank's error, when ``work`` raised a
            CheckpointError or an OSError on any rank (no rank is left waiting in a later
            collective).
    """
    result, error = _attempt(work)
    outcomes = (
        group.all_gather_object((result, error)) if group.world_size > 1 else [(result, error)]
    )
    _raise_first(error for _, error in outcomes)
    return [result for result, _ in outcomes]


def agree_or_raise(group: RankGroup, work: Callable[[], _T]) -> _T:
    """Run ``work`` on every rank and return this rank's result; only errors are exchanged.

    Raises:
        CheckpointError: as `gather_or_raise`.
    """
    result, error = _attempt(work)
    _raise_first(group.all_gather_object(error) if group.world_size > 1 else [error])
    return result  # type: ignore[return-value]


def _attempt(work: Callable[[], _T]) -> tuple[_T | None, str | None]:
    try:
        return work(), None
    except (CheckpointError, OSError) as err:
        return None, str(err)


def _raise_first(errors: Iterable[str | None]) -> None:
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise CheckpointError(first)


def hash_staged_share(
    group: RankGroup,
    staging: Path,
    prefix: str,
    written: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every rank: the manifest records of every file in ``staging``, named ``<prefix>/<file>``
    (where the files go in the checkpoint).

    ``written`` holds the records of the files this rank hashed while writing them
    (`trainer.checkpoint.dcp_hashing`); the ranks exchange them. A file nobody recorded (an
    engine that writes its own files), or whose size on disk is not the recorded one, is hashed
    from disk, each rank its share. Call it on every rank once all of them wrote their files
    (it is a collective).

    Raises:
        CheckpointError: on every rank, when a rank could not read a file of its share.
    """
    names = list_files(staging)
    sizes = {name: (staging / name).stat().st_size for name in names}
    recorded: dict[str, Mapping[str, Any]] = {}
    for part in gather_or_raise(group, lambda: dict(written or {})):
        recorded.update(part)
    merged = {
        f"{prefix}/{name}": dict(recorded[name])
        for name in names
        if name in recorded and recorded[name].get("size") == sizes[name]
    }
    rest = {name: size for name, size in sizes.items() if f"{prefix}/{name}" not in merged}
    if not rest:  # the same on every rank: same listing, same records
        return merged
    share = split_by_size(rest, group.world_size)[group.global_rank]

    def hash_share() -> dict[str, dict[str, Any]]:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {name: pool.submit(hash_file, str(staging / name)) for name in share}
            return {f"{prefix}/{name}": future.result() for name, future in futures.items()}

    for part in gather_or_raise(group, hash_share):
        merged.update(part)
    return merged


def verified_share(
    group: RankGroup, files: Mapping[str, Mapping[str, Any]], prefix: str
) -> set[str]:
    """The files under ``prefix/`` of a manifest's ``files`` that OTHER ranks verify.

    Each rank hashes its own share (`split_by_size` over the listed sizes) and skips these;
    the caller then agrees with the other ranks (`agree_or_raise`) before reading anything.
    """
    shards = {
        name: int(record["size"]) for name, record in files.items() if name.startswith(prefix + "/")
    }
    if group.world_size <= 1:
        return set()
    mine = split_by_size(shards, group.world_size)[group.global_rank]
    return set(shards) - set(mine)


def read_checkpoint_by_shares(group: RankGroup, directory: Path, prefix: str) -> dict[str, Any]:
    """`trainer.checkpoint.read_checkpoint` on every rank, each hashing only its share of the
    files under ``prefix/``; the ranks agree before anything else reads a shard.

    Raises:
        CheckpointError: on every rank, when any rank found a file missing, unlisted, altered
            or invalid (the first rank's message, naming the file).
    """

    def read() -> dict[str, Any]:
        others = verified_share(group, read_manifest(directory)["files"], prefix)
        return read_checkpoint(directory, verified_elsewhere=others)

    return agree_or_raise(group, read)
