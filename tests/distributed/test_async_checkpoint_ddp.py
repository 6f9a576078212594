"""AsyncCheckpointIO under DDP (2 processes, torchrun, gloo on CPU): process 0 writes in the
background, and the run keeps the checkpoints, bookkeeping and final weights of a synchronous one,
resumed or not (trainer/plugins/async_checkpoint.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.launch import ROOT, output_tail, torchrun
from trainer.checkpoint import read_checkpoint, verify_checkpoint
from trainer.checkpoint.atomic import is_temporary

WORKER = ROOT / "tests" / "distributed" / "async_checkpoint_worker.py"
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def run_worker(root: Path, *args: str) -> None:
    result = torchrun(WORKER, str(root), *args)
    assert result.returncode == 0, output_tail(result)


def outcome(root: Path, mode: str) -> tuple[list[str], list[dict], dict[str, torch.Tensor]]:
    folder = root / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    for name in names:
        assert not is_temporary(name), names
        verify_checkpoint(folder / name)
    tracked = [json.loads((root / f"rank{r}-{mode}.json").read_text()) for r in range(2)]
    return names, tracked, load_file(str(root / f"final-{mode}.safetensors"))


def test_ddp_background_saves_match_synchronous_ones_and_resume_exactly(tmp_path):
    run_worker(tmp_path / "sync", "full", "--sync")
    run_worker(tmp_path / "async", "full")
    run_worker(tmp_path / "resumed", "first-half")
    run_worker(tmp_path / "resumed", "resume")
    names, tracked, weights = outcome(tmp_path / "sync", "full")
    assert names == ["epoch=2-step=16", "epoch=2-step=18", "last"]
    assert read_checkpoint(tmp_path / "sync" / "checkpoints" / "last")["global_step"] == 18
    for run, mode in (("async", "full"), ("resumed", "resume")):
        got_names, got_tracked, got_weights = outcome(tmp_path / run, mode)
        assert got_names == names and got_tracked == tracked, run
        assert got_weights.keys() == weights.keys()
        for key, tensor in weights.items():
            assert torch.equal(got_weights[key], tensor), (run, key)
