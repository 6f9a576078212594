"""A checkpoint folder holds only regular files and folders: a named pipe (FIFO) is refused before
anything opens it, instead of blocking the loader forever (trainer/checkpoint/paths.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import write_checkpoint

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")

_TIMEOUT_S = 180  # refusing takes under a second; a hang (or load 10+) reaches this


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter and return its stdout; fail (not hang) on a block."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still blocked after {_TIMEOUT_S} s: a named pipe was opened")
    assert result.returncode == 0, result.stderr
    return result.stdout


def _checkpoint(folder: Path, step: int) -> Path:
    return write_checkpoint(
        folder, {"state_dict": {"w": torch.ones(2) * step}, "epoch": 0, "global_step": step}
    )


def _pipe_in_place_of(folder: Path, name: str) -> None:
    """``name`` becomes a FIFO, listed in the manifest as the empty file it reads as."""
    (folder / name).unlink()
    os.mkfifo(folder / name)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("function", ["verify_checkpoint", "read_checkpoint", "read_state"])
@pytest.mark.parametrize("name", ["state.json", "model.safetensors"])
def test_a_named_pipe_in_a_checkpoint_is_refused_without_blocking(
    tmp_path: Path, function: str, name: str
) -> None:
    folder = _checkpoint(tmp_path / "ck", 2)
    _pipe_in_place_of(folder, name)
    out = _run(f"""
        from trainer.checkpoint import format
        from trainer.errors import CheckpointError
        try:
            format.{function}({str(folder)!r})
        except CheckpointError as err:
            print("refused:", err)
    """)
    assert out.startswith("refused:") and f"{name}' is a named pipe (FIFO)" in out, out


def test_last_skips_a_folder_holding_a_named_pipe_without_blocking(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "step=1", 1)
    newest = _checkpoint(tmp_path / "step=2", 2)
    _pipe_in_place_of(newest, "state.json")
    piped_manifest = _checkpoint(tmp_path / "step=3", 3)
    (piped_manifest / "manifest.json").unlink()
    os.mkfifo(piped_manifest / "manifest.json")
    out = _run(f"""
        import warnings
        from trainer.checkpoint import find_latest_checkpoint
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            print(find_latest_checkpoint({str(tmp_path)!r}).name)
        for warning in caught:
            print(warning.message)
    """)
    chosen, *warned = out.splitlines()
    assert chosen == "step=1"
    assert any("step=2" in line and "named pipe" in line for line in warned), out
    assert any("step=3" in line and "named pipe" in line for line in warned), out
