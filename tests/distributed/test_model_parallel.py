"""ModelParallelStrategy (DTensor tensor parallelism + FSDP2 on a 2-D mesh): argument checks in
this process; real torchrun jobs on CPU (gloo) with 2 processes (DP=1 x TP=2: parity with the
dense model, sharded save -> resume, consolidation) and 4 processes (DP=2 x TP=2: parity)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

import trainer
from tests.distributed.launch import ROOT, output_tail, torchrun
from tests.distributed.model_parallel_worker import CLIP, Net, regression
from trainer.checkpoint import verify_checkpoint
from trainer.cli.checkpoint import consolidate  # `trainer checkpoint consolidate`, in-process
from trainer.errors import ConfigurationError
from trainer.strategies import ClusterEnvironment, ModelParallelStrategy, resolve_strategy


def launch(tmp_path_factory, nprocs: int) -> tuple:
    out = tmp_path_factory.mktemp(f"model_parallel{nprocs}")
    result = torchrun(ROOT / "tests/distributed/model_parallel_worker.py", str(out), nprocs=nprocs)
    assert result.returncode == 0, output_tail(result)
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    return launch(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    return launch(tmp_path_factory, 4)


def dense_final(batch_size: int, tmp_path) -> tuple[dict[str, torch.Tensor], trainer.Trainer]:
    """The same Net without a plan, in one process, with the global batch of the parallel run."""
    torch.manual_seed(0)
    dense = Net(is_parallel=False)
    fit = trainer.Trainer(
        max_epochs=2, seed=0, accelerator="cpu", gradient_clip_val=CLIP, enable_progress_bar=False,
        enable_model_summary=False, logger=False, enable_checkpointing=False,
        num_sanity_val_steps=0, default_root_dir=str(tmp_path),
    )  # fmt: skip
    fit.fit(dense, DataLoader(regression(), batch_size=batch_size, shuffle=False))
    return dense.state_dict(), fit


def assert_matches_dense(out, batch_size: int, tmp_path) -> None:
    expected, _ = dense_final(batch_size, tmp_path)
    final = load_file(str(out / "final.safetensors"))
    for name, value in expected.items():
        assert final[name].shape == value.shape  # gathered, not a shard
        assert torch.allclose(final[name], value, atol=1e-6), (
            name,
            (final[name] - value).abs().max(),
        )


@pytest.mark.distributed
def test_two_processes_tensor_parallel_matches_the_dense_model(run2, tmp_path):
    out, facts = run2
    assert [f["mesh"] for f in facts] == [[1, 2]] * 2  # "auto": TP over the machine's processes
    assert [f["sampler_kwargs"] for f in facts] == [{"num_replicas": 1, "rank": 0}] * 2
    assert [f["num_training_batches"] for f in facts] == [16, 16]
    placements = facts[0]["placements"]
    assert placements["inp.weight"][-1] == "S(0)" and placements["out.weight"][-1] == "S(1)"
    assert placements["norm.weight"] == ["S(0)"]  # FSDP only: clipping spans two meshes
    assert [f["samples_seen"] for f in facts] == [64.0, 64.0]
    assert [f["sum_of_ones"] for f in facts] == [1.0, 1.0] and facts[0]["max_of_ranks"] == 1.0
    assert_matches_dense(out, 4, tmp_path)


@pytest.mark.distributed
def test_two_processes_sharded_checkpoint_resumes_exactly_and_consolidates(run2, tmp_path):
    out, facts = run2
    assert all(f["resume_equal"] for f in facts)
    manifest = verify_checkpoint(out / "sharded")
    assert "dcp/.metadata" in manifest["files"] and manifest["global_step"] == 5
    merged = load_file(str(consolidate(out / "sharded", tmp_path / "full.safetensors")))
    assert merged["inp.weight"].shape == (8, 4) and merged["out.weight"].shape == (1, 8)


@pytest.mark.distributed
def test_four_processes_fsdp_times_tensor_parallel_matches_the_dense_model(run4, tmp_path):
    out, facts = run4
    assert [f["mesh"] for f in facts] == [[2, 2]] * 4
    # rank = dp_rank * 2 + tp_rank: peers 0,1 share replica 0's batches, 2,3 replica 1's.
    assert [f["sampler_kwargs"]["rank"] for f in facts] == [0, 0, 1, 1]
    assert [f["num_training_batches"] for f in facts] == [8] * 4  # 64 / (4 x 2 replicas)
    assert [f["samples_seen"] for f in facts] == [64.0] * 4  # summed over the 2 replicas only
    assert [f["sum_of_ones"] for f in facts] == [2.0] * 4 and facts[0]["max_of_ranks"] == 3.0
    assert_matches_dense(out, 8, tmp_path)  # global batch 2 replicas x 4


# ---- arguments (no processes started) ---------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size=0"),
        ({"data_parallel_size": "two"}, "data_parallel_size='two'"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size=True"),
    ],
)
def test_bad_sizes_name_the_argument(kwargs, named):
    with pytest.raises(ConfigurationError, match=named) as info:
        ModelParallelStrategy("cpu", **kwargs)
    assert "expected an int >= 1 or 'auto'" in str(info.value)


@pytest.mark.parametrize(
    ("sizes", "local_world", "expected"),
    [
        (("auto", "auto"), "4", (1, 4)),  # one machine: all tensor parallel
        (("auto", "auto"), "2", (2, 2)),  # two machines of 2: TP inside, DP across
        ((2, "auto"), "4", (2, 2)),
        (("auto", 1), "4", (4, 1)),
    ],
)
def test_auto_sizes_follow_lightning(monkeypatch, sizes, local_world, expected):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    strategy = ModelParallelStrategy(
        "cpu",
        data_parallel_size=sizes[0],
        tensor_parallel_size=sizes[1],
        environment=ClusterEnvironment(world_size=4),
    )
    assert strategy._resolve_sizes() == expected


def test_sizes_that_do_not_fill_the_job_are_refused(monkeypatch):
    strategy = ModelParallelStrategy(
        "cpu", data_parallel_size=3, tensor_parallel_size=2, environment=ClusterEnvironment(world_size=4)
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="3 x 2 processes do not match the 4 processes"):
        strategy._resolve_sizes()


def test_registered_under_lightnings_name_and_mesh_needs_setup():
    strategy = resolve_strategy("model_parallel", accelerator="cpu")
    assert isinstance(strategy, ModelParallelStrategy)
    with pytest.raises(trainer.StrategyError, match="built by setup_environment"):
        _ = strategy.device_mesh
