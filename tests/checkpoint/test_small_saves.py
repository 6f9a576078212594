"""A small checkpoint is written, hashed and verified on the calling thread (no thread started),
with the same files and the same refusals as a large one written by threads."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.checkpoint import read_checkpoint, tensor_files, verify_checkpoint, write_checkpoint
from trainer.checkpoint.tensor_files import InlineExecutor
from trainer.errors import CheckpointError


def _checkpoint() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    return {
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "epoch": 1,
        "global_step": 7,
        "rng": {"torch": torch.get_rng_state(), "python": (3, tuple(range(625)), None)},
    }


def _threads_started_during(action: Any) -> set[int]:
    """Threads started by ``threading`` while ``action`` runs (each calls the profile hook
    ``threading.setprofile`` installs as it starts)."""
    started: set[int] = set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        started.add(threading.get_ident())
        sys.setprofile(None)  # one event per thread is enough

    threading.setprofile(hook)
    try:
        action()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    return started


@pytest.fixture(params=["inline", "threads"])
def threshold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "threads":  # every save and load counts as large
        monkeypatch.setattr(tensor_files, "SMALL_SAVE_BYTES", 0)
    return request.param


def test_a_small_save_and_load_start_no_thread(tmp_path: Path) -> None:
    checkpoint = _checkpoint()
    path = tmp_path / "ck"
    assert not _threads_started_during(lambda: write_checkpoint(path, checkpoint))
    assert not _threads_started_during(lambda: read_checkpoint(path))
    assert not _threads_started_during(lambda: verify_checkpoint(path))


def test_a_large_save_still_uses_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_files, "SMALL_SAVE_BYTES", 0)
    assert _threads_started_during(lambda: write_checkpoint(tmp_path / "ck", _checkpoint()))


def test_both_ways_write_the_same_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inline = write_checkpoint(tmp_path / "inline", _checkpoint())
    monkeypatch.setattr(tensor_files, "SMALL_SAVE_BYTES", 0)
    threaded = write_checkpoint(tmp_path / "threads", _checkpoint())
    names = sorted(p.name for p in Path(inline).iterdir())
    assert names == sorted(p.name for p in Path(threaded).iterdir())
    for name in names:
        if name != "manifest.json":
            assert (Path(inline) / name).read_bytes() == (Path(threaded) / name).read_bytes()
    manifests = [json.loads((Path(p) / "manifest.json").read_text()) for p in (inline, threaded)]
    assert manifests[0]["files"] == manifests[1]["files"]


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors", "state.json"])
def test_one_changed_byte_is_refused_either_way(tmp_path: Path, threshold: str, name: str) -> None:
    path = Path(write_checkpoint(tmp_path / "ck", _checkpoint()))
    data = bytearray((path / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=name):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match=name):
        verify_checkpoint(path)


def test_a_read_back_checkpoint_equals_what_was_saved(tmp_path: Path, threshold: str) -> None:
    saved = _checkpoint()
    loaded = read_checkpoint(write_checkpoint(tmp_path / "ck", saved))
    for key, tensor in saved["state_dict"].items():
        assert torch.equal(loaded["state_dict"][key], tensor)
    assert torch.equal(loaded["rng"]["torch"], saved["rng"]["torch"])
    assert loaded["rng"]["python"] == saved["rng"]["python"]


def test_an_inline_jobs_error_is_raised_by_its_result() -> None:
    future = InlineExecutor().submit(int, "not a number")
    with pytest.raises(ValueError, match="not a number"):
        future.result()
