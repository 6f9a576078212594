"""Checkpoint digests: sha256 by default (DESIGN §6), BLAKE3 when opted in with
TRAINER_CHECKPOINT_DIGEST=blake3, both read either way, and every altered byte refused whichever
way a file is hashed (from disk, or from the tensors read).

Most tests here run with BLAKE3 opted in (the `_blake3_opted_in` fixture); the default is pinned
by `test_the_default_digest_is_sha256`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch

from trainer.checkpoint import read_checkpoint, tensor_files, verify_checkpoint, write_checkpoint
from trainer.checkpoint.format import MANIFEST, write_checkpoint_files
from trainer.checkpoint.tensor_files import hash_file, hash_read_tensors, read_safetensors
from trainer.errors import CheckpointError, ConfigurationError, MissingDependencyError


@pytest.fixture(autouse=True)
def _blake3_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINER_CHECKPOINT_DIGEST", "blake3")


def test_the_default_digest_is_sha256(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINER_CHECKPOINT_DIGEST")
    folder = write_checkpoint(tmp_path / "ck", _checkpoint())
    for name, record in _manifest(folder)["files"].items():
        data = (folder / name).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    read_checkpoint(folder)


def test_an_unknown_digest_setting_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_CHECKPOINT_DIGEST", "md5")
    with pytest.raises(ConfigurationError, match="TRAINER_CHECKPOINT_DIGEST='md5'"):
        write_checkpoint(tmp_path / "ck", _checkpoint())


def _checkpoint() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return {
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "epoch": 1,
        "global_step": 3,
        "extra": {"tensor": torch.arange(5)},
    }


def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())


def _rewrite_records(folder: Path, make: Any) -> None:
    manifest = _manifest(folder)
    for name in manifest["files"]:
        manifest["files"][name] = make((folder / name).read_bytes())
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _as_written_before(folder: Path) -> None:
    """The manifest form of the previous version: every record ``{"size", "sha256"}``."""
    _rewrite_records(
        folder, lambda data: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    )


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_every_file_is_recorded_with_its_blake3(tmp_path):
    folder = write_checkpoint(tmp_path / "ck", _checkpoint(), max_shard_size=600)
    files = _manifest(folder)["files"]
    assert {"model.safetensors.index.json", "optimizer.safetensors", "state.safetensors"} <= set(
        files
    )
    for name, record in files.items():
        data = (folder / name).read_bytes()
        assert record == {"size": len(data), "blake3": blake3.blake3(data).hexdigest()}, name


def test_a_checkpoint_written_before_with_sha256_still_verifies_and_loads(tmp_path):
    original = _checkpoint()
    folder = write_checkpoint(tmp_path / "ck", original)
    _as_written_before(folder)
    assert all("blake3" not in r for r in _manifest(folder)["files"].values())
    verify_checkpoint(folder)
    loaded = read_checkpoint(folder)
    assert _equal(loaded["state_dict"], original["state_dict"])
    assert _equal(loaded["optimizer_states"], original["optimizer_states"])
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (folder / "model.safetensors").write_bytes(bytes(data))
    for check in (verify_checkpoint, read_checkpoint):
        with pytest.raises(CheckpointError, match=r"model.safetensors does not match its sha256"):
            check(folder)


def _byte_positions(path: Path) -> dict[str, int]:
    header = int.from_bytes(path.read_bytes()[:8], "little")
    size = path.stat().st_size
    return {
        "header length": 0,
        "header": 8 + header // 2,
        "first data byte": 8 + header,
        "middle": (8 + header + size) // 2,
        "last byte": size - 1,
    }


@pytest.mark.parametrize("file", ["model.safetensors", "optimizer.safetensors", "state.json"])
@pytest.mark.parametrize(
    "where", ["header length", "header", "first data byte", "middle", "last byte"]
)
def test_every_altered_byte_is_refused(tmp_path, file, where):
    folder = write_checkpoint(tmp_path / "ck", _checkpoint())
    path = folder / file
    positions = (
        _byte_positions(path)
        if file.endswith(".safetensors")
        else {"header length": 0, "header": 1, "first data byte": 2, "middle": 20, "last byte": -1}
    )
    data = bytearray(path.read_bytes())
    data[positions[where]] ^= 0x01
    path.write_bytes(bytes(data))
    for check in (verify_checkpoint, read_checkpoint):
        with pytest.raises(CheckpointError, match=rf"{file} does not match its blake3"):
            check(folder)


def test_a_record_holding_both_digests_is_checked_against_its_sha256(tmp_path):
    # A tool written for format version 1 updates "sha256" and leaves the rest of a record.
    folder = write_checkpoint(tmp_path / "ck", _checkpoint())
    manifest = _manifest(folder)
    for name, record in manifest["files"].items():
        record["sha256"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        record["blake3"] = "0" * 64  # stale
    (folder / MANIFEST).write_text(json.dumps(manifest))
    verify_checkpoint(folder)


def test_a_record_without_a_digest_is_refused_naming_the_field(tmp_path):
    folder = write_checkpoint(tmp_path / "ck", _checkpoint())
    manifest = _manifest(folder)
    del manifest["files"]["state.json"]["blake3"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"field 'files.state.json.sha256' is missing"):
        read_checkpoint(folder)


def test_hashing_the_tensors_read_gives_the_files_digest(tmp_path):
    folder = write_checkpoint(tmp_path / "ck", _checkpoint())
    path = str(folder / "optimizer.safetensors")
    tensors, _ = read_safetensors(path)
    assert hash_read_tensors(path, tensors, "blake3") == hash_file(path, "blake3")
    assert hash_read_tensors(path, tensors, "sha256") == hash_file(path, "sha256")
    # Tensors that are not the file's: the file itself is hashed instead.
    other = {key: torch.zeros_like(value) for key, value in tensors.items()}
    other.popitem()
    assert hash_read_tensors(path, other, "blake3") == hash_file(path, "blake3")


def test_a_sharded_engines_files_are_hashed_while_ours_are_written(tmp_path):
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / "__0_0.distcp").write_bytes(b"shard" * 1000)
    write_checkpoint_files(tmp_path, {"state_dict": {"w": torch.ones(3)}, "global_step": 0})
    record = _manifest(tmp_path)["files"]["dcp/__0_0.distcp"]
    assert record == {"size": 5000, "blake3": blake3.blake3(b"shard" * 1000).hexdigest()}


def test_without_blake3_sha256_checkpoints_work_and_blake3_ones_name_the_package(
    tmp_path, monkeypatch
):
    with_blake3 = write_checkpoint(tmp_path / "b3", _checkpoint())

    def missing(*, required: bool) -> Any:
        if required:
            raise MissingDependencyError("... pip install blake3")
        return None

    monkeypatch.setattr(tensor_files, "_blake3_module", missing)
    with pytest.raises(MissingDependencyError, match="pip install blake3"):
        write_checkpoint(
            tmp_path / "refused", _checkpoint()
        )  # asked for blake3: not silently sha256
    monkeypatch.delenv("TRAINER_CHECKPOINT_DIGEST")
    folder = write_checkpoint(tmp_path / "ck", _checkpoint())
    assert all(set(r) == {"size", "sha256"} for r in _manifest(folder)["files"].values())
    read_checkpoint(folder)
    with pytest.raises(MissingDependencyError, match="pip install blake3"):
        read_checkpoint(with_blake3)
