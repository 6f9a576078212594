"""AsyncCheckpointIO under MegatronStrategy (TP=2, 2 processes, torchrun, gloo on CPU): every
process writes its DCP shards with ``async_save`` while training goes on (the FSDP path:
trainer/plugins/async_sharded.py, with Megatron's parallel sizes in the state), and the run keeps
the checkpoints, bookkeeping and final weights of a synchronous one, resumed or not. Failures and
kill -9 take the same writer and commit as FSDP's (tests/distributed/test_async_checkpoint_fsdp.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.launch import ROOT, output_tail, torchrun
from tests.distributed.test_async_checkpoint_fsdp import assert_same, inside_run, sharded_contents
from trainer._imports import is_available
from trainer.checkpoint import read_checkpoint
from trainer.checkpoint.atomic import is_temporary

WORKER = ROOT / "tests" / "distributed" / "async_checkpoint_megatron_worker.py"
NAMES = ["epoch=1-step=25", "epoch=1-step=30", "last"]  # top 2 by step, and `last` (step 32)
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not is_available("megatron.core"), reason="pip install 'trainer[megatron]'"),
]


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("megatron_async")
    result = torchrun(WORKER, str(root), timeout=300)
    assert result.returncode == 0, output_tail(result)
    return root


def facts(root: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads((root / name / f"rank{r}.json").read_text()) for r in range(2)]


def test_background_megatron_checkpoints_equal_synchronous_ones_tensor_for_tensor(megatron_run):
    expected, got = facts(megatron_run, "sync"), facts(megatron_run, "async")
    for rank in range(2):
        assert got[rank]["entries"] == expected[rank]["entries"] == NAMES, got[rank]
        for key in ("best_model_path", "last_model_path", "global_step"):
            assert got[rank][key] == expected[rank][key], (rank, key)
        assert any(end > begun for begun, end in got[rank]["spans"]), got[rank]["spans"]
        assert got[rank]["save_count"] == 7, got[rank]
    folder, reference = (
        megatron_run / "async" / "checkpoints",
        megatron_run / "sync" / "checkpoints",
    )
    assert sorted(p.name for p in folder.iterdir()) == NAMES  # no temporary left
    for name in NAMES:
        got_contents = inside_run(sharded_contents(folder / name), str(megatron_run / "async"))
        expected_contents = inside_run(
            sharded_contents(reference / name), str(megatron_run / "sync")
        )
        assert_same(got_contents, expected_contents, name)
        assert got_contents["state"]["model_parallel"]["tensor_model_parallel_size"] == 2
    final = load_file(str(megatron_run / "async" / "final.safetensors"))
    for key, tensor in load_file(str(megatron_run / "sync" / "final.safetensors")).items():
        assert torch.equal(final[key], tensor), key


def test_resume_from_a_background_megatron_checkpoint_gives_the_uninterrupted_weights(
    megatron_run,
):
    # Stopped after step 12 (background saves at steps 5 and 10, `last` at 12), then resumed.
    folder = megatron_run / "resume" / "checkpoints"
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)]
    assert read_checkpoint(folder / "last")["global_step"] == 32
    final = load_file(str(megatron_run / "resume" / "final.safetensors"))
    for key, tensor in load_file(str(megatron_run / "sync" / "final.safetensors")).items():
        assert torch.equal(final[key], tensor), key
    assert facts(megatron_run, "resume")[0]["entries"] == NAMES
