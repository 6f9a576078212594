"""The migration guides' ported Accelerate script, launched as the guide says: 2 processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.test_docs import _parse_blocks
from trainer.checkpoint import verify_checkpoint

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "migration" / "accelerate.md"
pytestmark = pytest.mark.distributed


def _ported_script() -> str:
    (block,) = [b for b in _parse_blocks(GUIDE) if "# the one changed line" in b.code]
    return block.code


def test_ported_accelerate_script_runs_on_two_processes(tmp_path: Path):
    (tmp_path / "train.py").write_text(_ported_script(), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "trainer.cli", "launch", "--num_processes", "2", "--cpu"]
    result = subprocess.run(
        [*command, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 10  # accelerator.print: the main process only
    accuracies = [float(re.search(r"acc (\S+)", line)[1]) for line in [*epochs, lines[-1]]]
    assert lines[-1].startswith("test acc ")
    assert min(accuracies[-3:]) > 0.9
    verify_checkpoint(tmp_path / "digits_state")
    weights = load_file(tmp_path / "digits_model" / "model.safetensors")
    assert sorted(weights) == ["0.bias", "0.weight", "3.bias", "3.weight"]
