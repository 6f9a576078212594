"""The Accelerator on 2 real processes: FSDP trains with an optimizer built before prepare, and
save_state / load_state replay an epoch exactly under DDP, FSDP (sharded state) and DeepSpeed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, torchrun
from trainer.checkpoint import verify_checkpoint

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed"])
def test_state_round_trip_replays_the_epoch_exactly(strategy: str, tmp_path: Path):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    result = torchrun(
        str(ROOT / "tests/distributed/accelerator_state_worker.py"), strategy, str(tmp_path)
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    facts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]

    for rank_facts in facts:
        # DeepSpeed's optimizer steps its own fp32 partitions, then copies them to the model.
        assert rank_facts["optimizer_holds_model_params"] or strategy == "deepspeed"
        assert rank_facts["weight_change"] > 1e-3  # the optimizer steps the prepared model
        assert rank_facts["first"] == rank_facts["second"]  # bit-identical losses
    assert facts[0]["first"] != facts[1]["first"]  # each rank saw its own shard and dropout
    manifest = verify_checkpoint(tmp_path / "state")
    assert manifest["world_size"] == 2
    if strategy == "fsdp":
        assert (tmp_path / "state" / "dcp").is_dir()  # sharded: every rank wrote its shards
    if strategy == "deepspeed":
        assert (tmp_path / "state" / "deepspeed").is_dir()  # the engine's own shard files
