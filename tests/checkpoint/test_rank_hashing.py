"""Splitting a sharded checkpoint's hashing between ranks (trainer.checkpoint.rank_hashing);
the 2-process behaviour is tests/distributed/test_fsdp.py's."""

from __future__ import annotations

import pytest
import torch

from trainer.checkpoint import read_checkpoint, verify_checkpoint
from trainer.checkpoint.format import write_checkpoint_files
from trainer.checkpoint.manifest import read_manifest
from trainer.checkpoint.rank_hashing import split_by_size, verified_share
from trainer.checkpoint.tensor_files import hash_file
from trainer.errors import CheckpointError


class OneOfTwo:
    """A rank of a 2-process job, as far as the split is concerned (no collective is used)."""

    def __init__(self, rank: int) -> None:
        self.global_rank, self.world_size = rank, 2


def test_split_by_size_is_balanced_complete_and_the_same_every_time():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10, ".metadata": 1}
    shares = split_by_size(sizes, 2)
    assert shares == split_by_size(dict(reversed(list(sizes.items()))), 2)
    assert sorted(shares[0] + shares[1]) == sorted(sizes)
    totals = [sum(sizes[n] for n in share) for share in shares]
    assert abs(totals[0] - totals[1]) <= 100 - 60 + 1
    assert split_by_size(sizes, 1) == [sorted(sizes, key=lambda n: (-sizes[n], n))]


def _sharded_like(directory):
    """A checkpoint folder holding engine shards under dcp/, as a sharded save leaves it."""
    (directory / "dcp").mkdir(parents=True)
    for rank in range(2):
        (directory / "dcp" / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 4096)
    (directory / "dcp" / ".metadata").write_bytes(b"m" * 16)
    write_checkpoint_files(directory, {"state_dict": {"w": torch.ones(2)}, "epoch": 0})


def test_each_rank_skips_only_the_other_ranks_shares(tmp_path):
    _sharded_like(tmp_path)
    files = read_manifest(tmp_path)["files"]
    skipped = [verified_share(OneOfTwo(rank), files, "dcp") for rank in range(2)]
    shards = {n for n in files if n.startswith("dcp/")}
    assert skipped[0] | skipped[1] == shards and not skipped[0] & skipped[1]
    assert (
        verified_share(type("Alone", (), {"global_rank": 0, "world_size": 1})(), files, "dcp")
        == set()
    )


def test_a_file_verified_elsewhere_is_not_hashed_here_but_its_size_is_checked(tmp_path):
    _sharded_like(tmp_path)
    shard = tmp_path / "dcp" / "__1_0.distcp"
    shard.write_bytes(b"\xff" * 4096)  # same size, other bytes
    with pytest.raises(CheckpointError, match="__1_0.distcp does not match"):
        read_checkpoint(tmp_path)
    assert read_checkpoint(tmp_path, verified_elsewhere={"dcp/__1_0.distcp"})["epoch"] == 0
    shard.write_bytes(b"\xff" * 10)  # truncated: refused whoever hashes it
    with pytest.raises(CheckpointError, match="__1_0.distcp has 10 bytes"):
        read_checkpoint(tmp_path, verified_elsewhere={"dcp/__1_0.distcp"})


def test_known_records_are_written_to_the_manifest_instead_of_hashing_again(tmp_path):
    (tmp_path / "dcp").mkdir()
    shard = tmp_path / "dcp" / "__0_0.distcp"
    shard.write_bytes(b"x" * 100)
    record = hash_file(str(shard))
    write_checkpoint_files(tmp_path, {"epoch": 1}, known_records={"dcp/__0_0.distcp": record})
    assert read_manifest(tmp_path)["files"]["dcp/__0_0.distcp"] == record
    verify_checkpoint(tmp_path)
    # a record for a file that is not there is not listed (the manifest lists what exists)
    other = tmp_path.parent / "other"
    other.mkdir()
    write_checkpoint_files(other, {"epoch": 1}, known_records={"dcp/__9_0.distcp": record})
    assert "dcp/__9_0.distcp" not in read_manifest(other)["files"]
