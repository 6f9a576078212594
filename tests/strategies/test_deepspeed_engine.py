"""trainer/strategies/deepspeed_engine.py: a lock left by an interrupted comm op build is named."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from trainer.strategies.deepspeed_engine import warn_if_comm_op_build_locked


def test_a_lock_left_by_an_interrupted_build_is_named(tmp_path: Path, monkeypatch):
    # torch's cpp_extension waits for the lock file without a word: a run after a killed build
    # hung forever on DeepSpeed's CPU accelerator.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    with pytest.warns(UserWarning, match="interrupted build") as caught:
        warn_if_comm_op_build_locked()
    assert str(lock) in str(caught[0].message)


def test_no_warning_without_a_lock(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_comm_op_build_locked()
