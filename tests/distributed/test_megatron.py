"""Real MegatronStrategy jobs: on CPU, one 2-process torchrun (gloo, TP=2) with parity against
the dense model, sharded save -> resume and consolidation; on a machine with 2+ CUDA GPUs, the
paths megatron.core runs only there (RNG tracker, sequence parallel, pipeline schedule)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import trainer
from tests.distributed.launch import ROOT, torchrun
from tests.distributed.megatron_worker import CLIP, DenseNet, loader
from trainer._imports import is_available
from trainer.checkpoint import verify_checkpoint
from trainer.cli.checkpoint import consolidate  # `trainer checkpoint consolidate`, in-process

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not is_available("megatron.core"), reason="pip install 'trainer[megatron]'"),
]
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="megatron.core runs its RNG tracker, sequence parallelism and pipeline schedules on CUDA only (2+ GPUs)",
)


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron")
    first_steps = dense_trainer(out, max_steps=5)  # a one-process checkpoint the TP=2 job
    first_steps.fit(dense_module(), loader())  # resumes from (tests/.../megatron_worker.py 6.)
    first_steps.save_checkpoint(out / "dense5")
    result = torchrun(str(ROOT / "tests/distributed/megatron_worker.py"), str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def dense_module() -> DenseNet:
    torch.manual_seed(1)
    return DenseNet()


def dense_trainer(root, **kwargs) -> trainer.Trainer:
    """A one-process Trainer with the parallel runs' settings."""
    options = dict(
        max_epochs=2, seed=0, accelerator="cpu", gradient_clip_val=CLIP, enable_progress_bar=False,
        enable_model_summary=False, logger=False, enable_checkpointing=False,
        num_sanity_val_steps=0, default_root_dir=str(root),
    )  # fmt: skip
    options.update(kwargs)
    return trainer.Trainer(**options)


def train_dense(initial: dict[str, torch.Tensor], batch_size: int, root) -> trainer.Trainer:
    """The dense reference in this process, from the parallel run's gathered initial weights."""
    dense = DenseNet()
    dense.load_state_dict(initial)
    fit = dense_trainer(root)
    fit.fit(dense, loader(batch_size))
    return fit


def assert_close(final: dict[str, torch.Tensor], dense: torch.nn.Module) -> None:
    for name, value in dense.state_dict().items():
        # The row-parallel all-reduce sums partial products in another order than one matmul.
        difference = (final[name] - value).abs().max()
        assert torch.allclose(final[name], value, atol=1e-6), (name, difference)


def test_column_row_pair_trained_by_the_trainer_matches_the_dense_model(megatron_run, tmp_path):
    out, facts = megatron_run
    initial = load_file(str(out / "initial.safetensors"))  # gathered from the TP=2 shards
    assert initial["col.weight"].shape == (8, 4) and facts[0]["col_weight_local_shape"] == [4, 4]
    fit = train_dense(initial, 4, tmp_path)
    assert_close(load_file(str(out / "final.safetensors")), fit.module)
    # The last step's loss is the dense one, on both tensor-parallel ranks.
    expected = float(fit.callback_metrics["train/loss"])
    assert [f["train_loss"] for f in facts] == pytest.approx([expected] * 2, abs=1e-6)


def test_data_parallel_replicas_use_ddp_over_megatrons_group_and_match_dense(
    megatron_run, tmp_path
):
    out, facts = megatron_run  # TP=1 x DP=2 on the same 2 processes
    assert [f["dp_sampler_kwargs"] for f in facts] == [
        {"num_replicas": 2, "rank": r} for r in (0, 1)
    ]
    assert [f["dp_wrapper"] for f in facts] == ["DistributedDataParallel"] * 2
    assert [f["dp_samples_seen"] for f in facts] == [64.0, 64.0]
    fit = train_dense(load_file(str(out / "initial_dp2.safetensors")), 8, tmp_path)  # 2 x 4
    assert_close(load_file(str(out / "final_dp2.safetensors")), fit.module)


def test_a_one_process_checkpoint_resumes_with_tensor_parallelism(megatron_run, tmp_path):
    out, _ = megatron_run
    fit = dense_trainer(tmp_path)  # the uninterrupted one-process run the checkpoint came from
    fit.fit(dense_module(), loader())
    assert_close(load_file(str(out / "from_dense.safetensors")), fit.module)


def test_a_tp2_checkpoint_loads_at_tp1(megatron_run):
    _, facts = megatron_run
    assert all(f["reshard_equal"] for f in facts)


def test_tensor_parallel_peers_see_the_same_batches(megatron_run):
    _, facts = megatron_run
    assert [f["sampler_kwargs"] for f in facts] == [{"num_replicas": 1, "rank": 0}] * 2
    assert [f["tp_rank"] for f in facts] == [0, 1]
    assert [f["num_training_batches"] for f in facts] == [16, 16]  # 64 samples / 4, not / 8
    assert all(f["batch_sums_agree"] for f in facts)
    assert [f["distributed_type"] for f in facts] == ["MEGATRON_LM"] * 2


def test_reductions_use_the_data_parallel_group_and_flags_every_rank(megatron_run):
    _, facts = megatron_run
    assert [f["sum_of_ones"] for f in facts] == [1.0, 1.0]  # one data-parallel rank
    assert [f["max_of_ranks"] for f in facts] == [1.0, 1.0]  # every process agrees
    assert [f["all_gather_rows"] for f in facts] == [1, 1]
    # self.log(..., reduce_fx="sum", sync_dist=True) counts each sample once, not once per peer.
    assert [f["samples_seen"] for f in facts] == [64.0, 64.0]


def test_sharded_checkpoint_resumes_exactly_and_consolidates(megatron_run, tmp_path):
    out, facts = megatron_run
    assert all(f["resume_equal"] for f in facts) and [f["resume_global_step"] for f in facts] == [
        32,
        32,
    ]
    manifest = verify_checkpoint(out / "sharded")
    names = set(manifest["files"])
    assert "dcp/.metadata" in names and "model.safetensors" not in names
    assert manifest["world_size"] == 2 and manifest["global_step"] == 5
    state = json.loads((out / "sharded" / "state.json").read_text())
    assert state["model_parallel"] == {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "data_parallel_size": 1,
    }  # fmt: skip
    merged = load_file(str(consolidate(out / "sharded", tmp_path / "full.safetensors")))
    step5 = load_file(str(out / "step5.safetensors"))
    assert set(merged) == set(step5) == {"col.weight", "col.bias", "row.weight", "row.bias"}
    assert all(torch.equal(merged[k], step5[k]) for k in step5)  # shards put back in place


def test_full_weights_load_into_tensor_parallel_shards(megatron_run):
    _, facts = megatron_run
    assert all(f["full_load_local_equal"] for f in facts)


def test_clip_grad_norm_is_the_norm_of_the_whole_model(megatron_run):
    _, facts = megatron_run
    assert [f["clip_norm_2"] for f in facts] == pytest.approx([14.0, 14.0])
    assert [f["clipped_grad"] for f in facts] == pytest.approx([1.0, 1.0], abs=1e-5)  # 2 x 7/14
    assert [f["clip_norm_inf"] for f in facts] == pytest.approx([1.0, 1.0], abs=1e-5)


# ---- CUDA only: these run where 2+ GPUs are visible (never run in this CPU-only session) ----
def _cuda_run(tmp_path, check: str) -> list[dict]:
    result = torchrun(str(ROOT / "tests/distributed/megatron_worker.py"), str(tmp_path), check)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@needs_two_gpus
def test_cuda_rng_tracker_forks_a_stream_per_tensor_parallel_rank(tmp_path):
    facts = _cuda_run(tmp_path, "cuda-rng")
    assert facts[0]["default_mask_sum"] == facts[1]["default_mask_sum"]  # same default stream
    assert facts[0]["forked_mask"] != facts[1]["forked_mask"]  # one stream per TP rank
    assert all(f["reseeded_equal"] for f in facts)  # the same seed gives the same masks


@needs_two_gpus
def test_cuda_sequence_parallel_and_gather_output_match_the_dense_model(tmp_path):
    facts = _cuda_run(tmp_path, "cuda-sequence-parallel")
    for f in facts:
        assert f["gather_output_max_diff"] < 1e-5
        assert f["sequence_parallel_output_max_diff"] < 1e-5
        assert f["norm_grad_max_diff"] < 1e-5  # partial norm gradients summed over TP


@needs_two_gpus
def test_cuda_pipeline_schedule_gradients_match_the_dense_model(tmp_path):
    facts = _cuda_run(tmp_path, "cuda-pipeline")
    assert [f["stage"] for f in facts] == [0, 1]
    assert all(f["grad_max_diff"] < 1e-5 for f in facts)
