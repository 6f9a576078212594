"""Real DeepSpeed jobs on CPU (torchrun, 2 processes, gloo): ZeRO 0-3 parity with DDP, bf16,
save -> resume, checkpoint layout and consolidation, the Accelerator path, one process.

One torchrun launch (deepspeed_worker.py) runs every multi-process scenario. DeepSpeed builds a
comm op on its first run (about a minute) under TORCH_EXTENSIONS_DIR; it defaults here to
~/.cache/torch_extensions so later runs (and CI with that directory cached) reuse it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.launch import ROOT, job_env, torchrun
from trainer.checkpoint import read_checkpoint, verify_checkpoint
from trainer.errors import CheckpointError

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (pip install 'trainer[deepspeed]')",
    ),
]

# Parity tolerance: observed max |DeepSpeed - DDP| is 3e-8 after 8-16 SGD+momentum steps. ZeRO
# reduces gradients in other buckets and order (reduce-scatter, pre-division by the world size)
# than DDP's all-reduce, so the fp32 sums differ in the last bits; 1e-6 is the DDP test's bound.
ATOL = 1e-6


def _env() -> dict[str, str]:
    env = job_env(DS_ACCELERATOR="cpu")
    env.setdefault(
        "TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    )
    return env


@pytest.fixture(scope="module")
def docs_example(tmp_path_factory):
    """docs/strategies/deepspeed.md's runnable blocks, started at once so they run beside the
    torchrun job (tests/test_docs.py reads docs/*.md only, not docs/strategies/)."""
    page = (ROOT / "docs" / "strategies" / "deepspeed.md").read_text(encoding="utf-8")
    blocks = re.findall(r"(<!-- no-run -->\n)?```python\n(.*?)```", page, flags=re.DOTALL)
    runnable = [code for marker, code in blocks if not marker]
    assert runnable, "the page has no runnable example"
    folder = tmp_path_factory.mktemp("docs_example")
    (folder / "example.py").write_text("\n".join(runnable), encoding="utf-8")
    env = {k: v for k, v in _env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    job = subprocess.Popen(
        [sys.executable, "example.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=folder,
    )  # fmt: skip
    yield job
    job.kill()
    job.communicate()


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory, docs_example):
    out = tmp_path_factory.mktemp("deepspeed")
    result = torchrun(
        ROOT / "tests/distributed/deepspeed_worker.py", str(out), timeout=600, env=_env()
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero2offload", "zero3offload"])
def test_zero_stage_matches_ddp(ds_run, name):
    _, facts = ds_run
    for f in facts:
        assert f[f"{name}_plain_diff"] <= ATOL
        assert f[f"{name}_plain_steps"] == [16, 16] == [f["ddp_plain_steps"]] * 2
        assert f[f"{name}_plain_model_type"] == "DeepSpeedModel"  # forward via the engine
    assert facts[0]["distributed_type"] == "DEEPSPEED"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_accumulation_and_clipping_match_ddp_and_global_step_counts_optimizer_steps(ds_run, stage):
    _, facts = ds_run
    for f in facts:
        # accumulate_grad_batches=2, gradient_clip_val=0.5: 16 batches -> 8 optimizer steps, and
        # DeepSpeed's own counter agrees. Unset clipping must be 0, not DeepSpeed's default 1.0
        # (the plain runs above would drift otherwise).
        assert f[f"zero{stage}_accum_clip_diff"] <= ATOL
        assert f[f"zero{stage}_accum_clip_steps"] == [8, 8] == [f["ddp_accum_clip_steps"]] * 2


def test_bf16_mixed_trains_without_casts_in_the_step(ds_run):
    _, facts = ds_run
    for f in facts:
        assert f["bf16_param_dtype"] == "torch.bfloat16"  # DeepSpeed's bf16: bf16 weights
        assert f["bf16_model_type"] == "DeepSpeedModel"
        losses = f["bf16_val_loss"]
        assert losses["bf16"] < losses["initial"] / 3  # it learned: 16.8 -> 4.29 (fp32 DDP: 4.32)
        assert abs(losses["bf16"] - losses["fp32_ddp"]) < 0.05 * losses["fp32_ddp"]
        assert f["bf16_diff_vs_fp32_ddp"] < 0.2  # bf16 rounding over 16 steps, weights ~O(1)


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_save_then_resume_is_exact(ds_run, name):
    _, facts = ds_run
    for f in facts:
        assert f[f"{name}_resume_diff"] == 0.0  # zero2: fp32; zero3: bf16 with fp32 masters
        assert f[f"{name}_resume_steps"] == [16, 16]


def test_checkpoint_layout_is_deepspeed_shards_inside_the_manifest(ds_run):
    out, _ = ds_run
    for name, stage in (("zero2", 2), ("zero3", 3)):
        manifest = verify_checkpoint(out / f"ck_{name}")
        files = set(manifest["files"])
        shards = {n for n in files if re.fullmatch(r"deepspeed/checkpoint/.*_optim_states\.pt", n)}
        assert len(shards) == 2, files  # one optimizer partition per rank
        assert "state.json" in files and "model.safetensors" not in files
        assert manifest["world_size"] == 2 and manifest["global_step"] == 5
        checkpoint = read_checkpoint(out / f"ck_{name}")
        assert checkpoint["deepspeed"]["zero_stage"] == stage
        assert checkpoint["deepspeed"]["module_prefix"] == "module."  # the Trainer's step router
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_a_damaged_shard_is_refused_before_deepspeed_reads_it(ds_run, tmp_path):
    out, _ = ds_run
    copy = tmp_path / "ck"
    shutil.copytree(out / "ck_zero2", copy)
    shard = next((copy / "deepspeed" / "checkpoint").glob("zero_pp_rank_1_*optim_states.pt"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        verify_checkpoint(copy)


def test_a_folder_that_cannot_be_created_is_refused_on_both_ranks(ds_run):
    """Before: process 0 failed inside DeepSpeed and process 1 waited at DeepSpeed's barrier."""
    _, facts = ds_run
    for rank_facts in facts:
        message = rank_facts["uncreatable_refusal"]
        assert message is not None and "cannot create checkpoint" in message
        assert "a_file" in message


def test_each_rank_verifies_its_share_and_a_damaged_shard_is_refused_on_both(ds_run):
    _, facts = ds_run
    shares = [set(f["ds_my_share"]) for f in facts]
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(facts[0]["ds_shards"])
    for rank_facts in facts:
        assert len(rank_facts["ds_refusals"]) == 2
        for name, message in rank_facts["ds_refusals"].items():
            assert message is not None and name in message and "does not match" in message


def test_consolidate_zero_shards_into_one_safetensors_file(ds_run, tmp_path):
    out, facts = ds_run
    # ZeRO-3 (bf16) through the command line; ZeRO-2 (fp32) through trainer.cli's main() on rank 0
    # of the job, which saves a second interpreter importing DeepSpeed.
    result = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "checkpoint", "consolidate", str(out / "ck_zero3"), str(out / "zero3.safetensors")],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert facts[0]["consolidate_zero2_status"] == 0
    for name in ("zero2", "zero3"):
        merged = load_file(str(out / f"{name}.safetensors"))
        at_save = load_file(str(out / f"{name}_at_save.safetensors"))
        assert set(merged) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
        assert all(v.dtype == torch.float32 for v in merged.values())  # the fp32 master weights
        assert merged["net.0.weight"].shape == (8, 4)  # full, not a partition
        # zero2 trained in fp32: exact. zero3 in bf16: the masters round to the bf16 weights.
        tolerance = 0.0 if name == "zero2" else 1e-2
        for key, value in at_save.items():
            assert torch.allclose(merged[key], value, atol=tolerance, rtol=tolerance), key


def test_validate_from_a_checkpoint_and_after_fit(ds_run):
    """From a checkpoint with no engine: consolidated weights; after fit: the fitted engine."""
    _, facts = ds_run
    for f in facts:
        got, expected = f["zero2_validate_from_ckpt"]
        assert got == pytest.approx(expected, rel=1e-5)
        got, expected = f["zero3_validate_from_ckpt"]  # bf16 autocast vs fp32 arithmetic
        assert got == pytest.approx(expected, rel=1e-2)
        got, expected = f["zero2_validate_after_fit"]  # through the fitted engine
        assert got == pytest.approx(expected, rel=1e-5)
        got, expected = f["zero3_validate_after_fit"]
        assert got == pytest.approx(expected, rel=1e-2)


def test_weights_only_checkpoint_of_zero3_is_gathered(ds_run):
    out, _ = ds_run
    checkpoint = read_checkpoint(out / "weights_only")
    expected = load_file(str(out / "weights_only_expected.safetensors"))
    assert not (out / "weights_only" / "deepspeed").exists()
    assert checkpoint["state_dict"].keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(checkpoint["state_dict"][key].float(), value), key


def test_accelerator_path_prepares_backward_and_steps_through_the_engine(ds_run):
    _, facts = ds_run
    for f in facts:
        assert f["accelerator_model_type"] == "DeepSpeedModel"
        assert f["accelerator_engine_type"] == "DeepSpeedEngine"
        assert f["accelerator_optimizer_type"] == "DeepSpeedZeroOptimizer"
        assert f["accelerator_engine_steps"] == 4  # 8 batches per rank, accumulation 2
        assert f["accelerator_diff"] <= ATOL


def test_the_docs_example_runs_in_one_process(docs_example):
    stdout, stderr = docs_example.communicate(timeout=300)
    assert docs_example.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "optimizer steps: 16 engine steps: 16" in stdout
    assert "DeepSpeedModel DeepSpeedEngine 4" in stdout
