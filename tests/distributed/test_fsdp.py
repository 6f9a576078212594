"""Real 2-process FSDP2 jobs (torchrun, gloo on CPU): parity with DDP, wrapping, RAM-efficient
loading, sharded checkpoints with exact resume, consolidation, and launching from a config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.distributed.fsdp_worker import Net
from tests.distributed.launch import ROOT, run_job, torchrun
from trainer.checkpoint import read_checkpoint, verify_checkpoint

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    result = torchrun(str(ROOT / "tests/distributed/fsdp_worker.py"), str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_fsdp_matches_ddp(fsdp_run):
    _, facts = fsdp_run
    assert facts[0]["fsdp_vs_ddp_max_diff"] <= 1e-6
    assert [f["distributed_type"] for f in facts] == ["FSDP", "FSDP"]
    assert facts[0]["param_is_dtensor"] == "DTensor"


def test_predict_runs_as_many_forwards_on_every_rank(fsdp_run):
    """Predict pads no batch under DDP; an FSDP forward gathers the shards from every rank, so
    there it keeps the padded last round instead of leaving one rank waiting."""
    _, facts = fsdp_run
    assert [f["predicted_batches"] for f in facts] == [[2, 2, 2]] * 2


def test_transformer_based_wrap_shards_exactly_the_named_layers(fsdp_run):
    _, facts = fsdp_run
    assert facts[0]["sharded_modules"] == ["blocks.0", "blocks.1"]  # plus the root, nothing else


def test_cpu_ram_efficient_loading_gives_every_rank_rank0_weights(fsdp_run):
    _, facts = fsdp_run
    assert [f["built_on_meta"] for f in facts] == ["cpu", "meta"]
    assert all(
        f["ram_efficient_equal_rank0"] and f["ram_efficient_local_shard_equal"] for f in facts
    )


def test_sharded_checkpoint_layout_resume_and_consolidation(fsdp_run, tmp_path):
    out, facts = fsdp_run
    assert all(f["sharded_resume_equal"] for f in facts)
    manifest = verify_checkpoint(out / "sharded")
    names = set(manifest["files"])
    assert "dcp/.metadata" in names and any(
        n.startswith("dcp/__") and n.endswith(".distcp") for n in names
    )
    assert (
        manifest["world_size"] == 2 and "state.json" in names and "model.safetensors" not in names
    )
    result = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "checkpoint", "consolidate", str(out / "sharded"), str(tmp_path / "full.safetensors")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    merged = load_file(str(tmp_path / "full.safetensors"))
    assert set(merged) == {
        "inp.weight",
        "inp.bias",
        "blocks.0.linear.weight",
        "blocks.0.linear.bias",
        "blocks.1.linear.weight",
        "blocks.1.linear.bias",
        "out.weight",
        "out.bias",
    }
    assert merged["inp.weight"].shape == (8, 4)  # full, not a shard
    # Lightning's way back to a module: the shards merged in this process, equal to consolidate's
    loaded = Net.load_from_checkpoint(out / "sharded")
    assert loaded.state_dict().keys() == merged.keys()
    assert all(torch.equal(loaded.state_dict()[k], merged[k]) for k in merged)


def test_each_rank_verifies_its_share_and_a_tampered_shard_is_refused_on_every_rank(fsdp_run):
    _, facts = fsdp_run
    shards = facts[0]["shards"]
    assert len(shards) >= 3  # .metadata and one .distcp per rank
    shares = [set(f["my_share"]) for f in facts]
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(shards)  # every shard hashed by exactly one rank
    for name in shards:
        for rank_facts in facts:
            message = rank_facts["refusals"][name]
            assert message is not None and name in message and "does not match" in message


def test_full_state_dict_type_writes_gathered_safetensors(fsdp_run):
    out, _ = fsdp_run
    checkpoint = read_checkpoint(out / "full")
    assert checkpoint["state_dict"]["inp.weight"].shape == (8, 4)
    assert checkpoint["global_step"] == 3 and not (out / "full" / "dcp").exists()
    assert isinstance(checkpoint["optimizer_states"][0]["state"], dict)


def test_trainer_launch_with_an_fsdp_config_file_runs_fsdp_on_cpu(tmp_path):
    config = tmp_path / "fsdp.yaml"
    config.write_text(yaml.safe_dump({
        "distributed_type": "FSDP", "num_processes": 2, "use_cpu": True, "mixed_precision": "no",
        "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "NO_WRAP", "fsdp_state_dict_type": "FULL_STATE_DICT"},
    }))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)}
    result = run_job(
        [sys.executable, "-m", "trainer.cli", "launch", "--config_file", str(config), "tests/distributed/launch_target.py", str(tmp_path)],
        timeout=240, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [f["strategy"] for f in facts] == ["FSDPStrategy", "FSDPStrategy"] and [
        f["world_size"] for f in facts
    ] == [2, 2]
    assert torch.tensor([f["steps"] for f in facts]).tolist() == [4, 4]


def test_worker_file_exists():
    assert Path(ROOT / "tests/distributed/fsdp_worker.py").is_file()
