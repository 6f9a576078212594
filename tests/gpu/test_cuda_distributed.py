"""Process groups on a CUDA device: sync_batchnorm (2 processes, one GPU) and FSDP2 in bf16.

Skipped without CUDA. Two processes share the machine's one GPU over gloo (NCCL refuses two
ranks on one device; gloo runs CUDA tensors, and torch's SyncBatchNorm has a gloo path).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from tests.conftest import quiet_trainer
from tests.distributed.launch import output_tail, torchrun
from tests.gpu.cuda_job import BatchNormNet, regression

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.distributed,
]
JOB = Path(__file__).with_name("cuda_job.py")


def one_process_with_twice_the_batch(tmp_path: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    module = BatchNormNet()
    quiet_trainer(tmp_path, accelerator="cuda", devices=1, max_epochs=2, seed=0).fit(
        module, DataLoader(regression(64), batch_size=8)
    )
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def test_sync_batchnorm_on_two_processes_ends_like_one_process_with_twice_the_batch(tmp_path):
    for mode in ("syncbn", "plain-bn"):
        result = torchrun(JOB, mode, str(tmp_path), nprocs=2, timeout=240)
        assert result.returncode == 0, output_tail(result)
    reference = one_process_with_twice_the_batch(tmp_path / "one")
    synced = load_file(str(tmp_path / "syncbn.safetensors"))
    plain = load_file(str(tmp_path / "plain-bn.safetensors"))
    assert json.loads((tmp_path / "syncbn.json").read_text())["kinds"] == ["SyncBatchNorm"]
    assert json.loads((tmp_path / "plain-bn.json").read_text())["kinds"] == ["BatchNorm1d"]
    assert set(synced) == set(reference)
    for key, value in reference.items():
        if value.is_floating_point():
            torch.testing.assert_close(synced[key], value, rtol=1e-4, atol=1e-5, msg=key)
        else:
            assert torch.equal(synced[key], value), key
    # Without it each process normalizes by its own 4 samples: the statistics differ.
    drift = (plain["net.1.running_var"] - reference["net.1.running_var"]).abs().max()
    assert drift > 1e-3


def test_fsdp2_bf16_on_cuda_with_background_sharded_checkpoints_resumes_exactly(tmp_path):
    result = torchrun(JOB, "fsdp", str(tmp_path), nprocs=1, timeout=300)
    assert result.returncode == 0, output_tail(result)
    facts = json.loads((tmp_path / "fsdp.json").read_text())
    assert facts["input_device"] == "cuda" and facts["param_device"] == "cuda"
    assert facts["activation_dtype"] == "torch.bfloat16", facts
    assert facts["kept"] == ["epoch=0-step=3", "epoch=0-step=6"], facts
    assert facts["resume_equal"], facts


def test_deepspeed_bf16_on_cuda_background_saves_equal_synchronous_and_resume_exactly(tmp_path):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    result = torchrun(JOB, "deepspeed", str(tmp_path), nprocs=1, timeout=400)
    assert result.returncode == 0, output_tail(result)
    facts = json.loads((tmp_path / "deepspeed.json").read_text())
    for run, dtype in (("zero2", "bfloat16"), ("zero3", "bfloat16"), ("zero2-fp16", "float16")):
        seen = facts[run]
        assert seen["input_device"] == "cuda", seen
        assert seen["activation_dtype"] == f"torch.{dtype}", seen
        assert_same_training(seen)


def assert_same_training(seen: dict) -> None:
    assert seen["kept"] == ["epoch=0-step=3", "epoch=0-step=6"], seen
    assert seen["finite"], seen
    assert seen["async_equals_sync"], seen
    assert seen["resume_equal"], seen


def test_megatron_bf16_on_cuda_background_saves_equal_synchronous_and_resume_exactly(tmp_path):
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed")
    result = torchrun(JOB, "megatron", str(tmp_path), nprocs=1, timeout=400)
    assert result.returncode == 0, output_tail(result)
    seen = json.loads((tmp_path / "megatron.json").read_text())
    assert seen["param_device"] == "cuda", seen
    assert_same_training(seen)
