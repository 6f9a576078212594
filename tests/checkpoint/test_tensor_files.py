"""The one safetensors header parser refuses malformed headers with a CheckpointError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer.checkpoint.tensor_files import parse_safetensors_header
from trainer.errors import CheckpointError


def _write_raw(path: Path, header: object, data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
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
