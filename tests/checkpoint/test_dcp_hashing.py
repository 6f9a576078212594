"""DCP's writer hashing its files as it writes them (trainer.checkpoint.dcp_hashing), and the
sharded save's use of those records instead of a second pass (rank_hashing.hash_staged_share).
Two processes writing and verifying such checkpoints: tests/distributed/test_fsdp.py."""

from __future__ import annotations

import hashlib
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainer.checkpoint.dcp_hashing import HashingFileSystemWriter, _HashingStream
from trainer.checkpoint.format import write_checkpoint_files
from trainer.checkpoint.manifest import list_files, read_manifest
from trainer.checkpoint.rank_hashing import hash_staged_share
from trainer.checkpoint.tensor_files import DIGEST_ENV, hash_file


class Alone:
    """A one-process group: no collective is needed."""

    global_rank, world_size = 0, 1

    def all_gather_object(self, obj):
        return [obj]


def _state() -> dict:
    torch.manual_seed(0)
    return {
        "model": {"w": torch.randn(300, 200), "b": torch.randn(200), "step": torch.tensor(7)},
        "optimizers": [{"lr": 0.1, "betas": [0.9, 0.99], "name": "adam"}],  # DCP byte items
    }


def _dcp_save(state: dict, folder) -> HashingFileSystemWriter:
    writer = HashingFileSystemWriter(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is not initialized": one process
        dcp.save(state, storage_writer=writer)
    return writer


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_every_file_dcp_wrote_has_the_record_of_its_bytes_on_disk(tmp_path, monkeypatch, algorithm):
    monkeypatch.setenv(DIGEST_ENV, algorithm)
    state = _state()
    writer = _dcp_save(state, tmp_path)
    records = writer.records
    assert sorted(records) == list_files(tmp_path)  # the shard and .metadata, nothing else
    assert ".metadata" in records and len(records) >= 2
    for name, record in records.items():
        assert record == hash_file(str(tmp_path / name), algorithm), name
    loaded = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    loaded["optimizers"] = [{"lr": 0.0, "betas": [0.0, 0.0], "name": ""}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(loaded, checkpoint_id=str(tmp_path))
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    assert loaded["optimizers"] == state["optimizers"]


def test_a_second_save_with_the_same_writer_starts_its_records_afresh(tmp_path):
    writer = _dcp_save(_state(), tmp_path / "one")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"x": torch.ones(3)}, storage_writer=writer, checkpoint_id=str(tmp_path / "two"))
    assert sorted(writer.records) == list_files(tmp_path / "two")
    for name, record in writer.records.items():
        assert record == hash_file(str(tmp_path / "two" / name))


def test_a_small_write_is_hashed_as_written_even_when_its_buffer_is_reused(tmp_path):
    # torch.save hands the writer views of buffers it reuses (zip headers): the digest must be
    # of the bytes at the moment of the write, not of what the buffer holds later.
    buffer = bytearray(b"a" * 4096)
    with open(tmp_path / "f", "wb") as file:
        stream = _HashingStream(file, "sha256")
        stream.write(memoryview(buffer))
        buffer[:] = b"b" * 4096
        stream.write(memoryview(buffer))
        stream.close()
    expected = hashlib.sha256(b"a" * 4096 + b"b" * 4096).hexdigest()
    assert stream.record() == {"size": 8192, "sha256": expected}
    assert hash_file(str(tmp_path / "f"), "sha256") == stream.record()


def test_recorded_files_are_not_hashed_again_unless_their_size_differs(tmp_path):
    for name, size in (("__0_0.distcp", 100), ("__1_0.distcp", 50), (".metadata", 10)):
        (tmp_path / name).write_bytes(b"x" * size)
    trusted = {"size": 100, "sha256": "0" * 64}  # not the file's digest: proves nothing re-read it
    written = {"__0_0.distcp": trusted, "__1_0.distcp": {"size": 49, "sha256": "1" * 64}}
    records = hash_staged_share(Alone(), tmp_path, "dcp", written=written)
    assert records["dcp/__0_0.distcp"] == trusted
    assert records["dcp/__1_0.distcp"] == hash_file(str(tmp_path / "__1_0.distcp"))  # size differs
    assert records["dcp/.metadata"] == hash_file(str(tmp_path / ".metadata"))  # nobody recorded it
    assert sorted(records) == [f"dcp/{name}" for name in list_files(tmp_path)]


def test_a_known_record_whose_size_is_not_the_files_is_hashed_again_at_commit(tmp_path):
    (tmp_path / "dcp").mkdir()
    shard = tmp_path / "dcp" / "__0_0.distcp"
    shard.write_bytes(b"y" * 64)
    stale = {"size": 63, "sha256": "2" * 64}
    write_checkpoint_files(tmp_path, {"epoch": 0}, known_records={"dcp/__0_0.distcp": stale})
    assert read_manifest(tmp_path)["files"]["dcp/__0_0.distcp"] == hash_file(str(shard))
