"""Accelerator.save_model on 2 real processes, called from the main process only (Accelerate's
idiom): no collective inside it that the other process never joins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, output_tail, torchrun

pytestmark = pytest.mark.distributed


def test_save_model_on_the_main_process_only_completes(tmp_path: Path):
    # save_model ended with a barrier: rank 0's paired with rank 1's wait_for_everyone, rank 0's
    # own wait_for_everyone with rank 1's end_training, and rank 0's end_training then waited
    # for a process that had left.
    result = torchrun(
        str(ROOT / "tests/distributed/save_model_worker.py"), str(tmp_path), timeout=120
    )
    assert result.returncode == 0, output_tail(result)
    for rank in range(2):
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert facts == {"names": ["bias", "weight"], "equal": True}
