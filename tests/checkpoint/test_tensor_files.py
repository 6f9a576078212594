"""The one safetensors header parser refuses malformed headers with a CheckpointError, as the
``safetensors`` library refuses them, and reads what that library writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from trainer.checkpoint.tensor_files import parse_safetensors_header
from trainer.errors import CheckpointError


def _write_raw(path: Path, header: object, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


def test_reads_a_real_file(tmp_path: Path) -> None:
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, tmp_path / "a.safetensors")
    entries, _ = parse_safetensors_header(tmp_path / "a.safetensors")
    assert [(e.key, e.dtype, e.shape) for e in entries] == [("w", torch.float32, (2, 3))]


@pytest.mark.parametrize("header", [7, "text", [1, 2], None])
def test_a_header_that_is_not_an_object_is_refused(tmp_path: Path, header: object) -> None:
    path = _write_raw(tmp_path / "bad.safetensors", header)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        parse_safetensors_header(path)


def test_a_negative_offset_is_refused(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}
    path = _write_raw(tmp_path / "bad.safetensors", header, b"\0" * 8)
    with pytest.raises(CheckpointError, match="offsets"):
        parse_safetensors_header(path)


def test_what_the_safetensors_library_writes_is_read(tmp_path: Path) -> None:
    tensors = {"a": torch.zeros(0), "b": torch.zeros(0, 3), "c": torch.ones(2), "d": torch.ones(1)}
    save_file(tensors, tmp_path / "a.safetensors", metadata={"format": "pt"})
    entries, metadata = parse_safetensors_header(tmp_path / "a.safetensors")
    assert sorted(e.key for e in entries) == ["a", "b", "c", "d"] and metadata == {"format": "pt"}


def _tensor(shape: str = "[1]", offsets: str = "[0,4]") -> bytes:
    return f'{{"w":{{"dtype":"F32","shape":{shape},"data_offsets":{offsets}}}}}'.encode()


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        (b"[" * 100_000 + b"]" * 100_000, b"", "recursion"),  # a RecursionError in json before
        (_tensor(shape="[1e400]"), b"\0" * 4, r"'w': 'shape' must be .* integers"),  # Overflow
        (_tensor(offsets="[0,1e400]"), b"\0" * 4, r"'w': 'data_offsets' must be"),
        (_tensor(shape='"14"', offsets="[0,16]"), b"\0" * 16, "'shape' must be"),  # not (1, 4)
        (_tensor(shape="[true]"), b"\0" * 4, "'shape' must be"),
        (_tensor(shape="[1.0]"), b"\0" * 4, "'shape' must be"),
        (_tensor(offsets="[0,4,4]"), b"\0" * 4, "do not match its shape"),
        (_tensor(offsets="[4,8]"), b"\0" * 8, "starts at data byte 4, not 0"),  # a gap
        (_tensor(), b"\0" * 8, "end at byte"),  # bytes after the last tensor
        (_tensor(), b"\0" * 2, "end at byte"),  # the file ends inside it
        (
            b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
            b"\0" * 4,
            "overlap",
        ),
        (b'{"__metadata__":{"aliases":{"a":"b"}}}', b"", "'__metadata__' must map"),
    ],
    ids=[
        "nested",
        "shape-1e400",
        "offset-1e400",
        "shape-str",
        "shape-bool",
        "shape-float",
        "3-offsets",
        "gap",
        "trailing",
        "short",
        "overlap",
        "metadata-dict",
    ],
)
def test_a_header_the_safetensors_library_refuses_is_refused(
    tmp_path: Path, header: bytes, data: bytes, match: str
) -> None:
    path = _write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(SafetensorError):
        safe_open(path, framework="pt")  # the library agrees: the file is not safetensors
    with pytest.raises(CheckpointError, match=rf"bad\.safetensors is not a readable .*{match}"):
        parse_safetensors_header(path)
