"""ParallelismConfig layouts in real torchrun jobs (gloo on CPU) against one process.

2 processes: FSDP (dp_shard 2), DDP (dp_replicate 2, and all sizes 1), TP (tp 2).
4 processes: HSDP (dp_replicate 2 x dp_shard 2, with a DCP save/load round trip) and
FSDP x TP (dp_shard 2 x tp 2). Each trains with an Accelerator loop; the gathered weights
match the dense model trained in one process with the global batch.
"""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import ROOT, output_tail, torchrun

pytestmark = pytest.mark.distributed


def launch(tmp_path_factory, nprocs: int) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp(f"parallelism{nprocs}")
    result = torchrun(ROOT / "tests/distributed/parallelism_worker.py", str(out), nprocs=nprocs)
    assert result.returncode == 0, output_tail(result)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
    return {layout: [facts[layout] for facts in ranks] for layout in ranks[0]}


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    return launch(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    return launch(tmp_path_factory, 4)


def layout(run: dict, **sizes: int) -> list[dict]:
    return run[json.dumps(sizes)]


def test_dp_shard_is_fsdp2_over_all_processes(run2):
    facts = layout(run2, dp_shard_size=2)
    assert [f["strategy"] for f in facts] == ["ModelParallelStrategy"] * 2
    assert [f["data_parallel"] for f in facts] == [[2, 0], [2, 1]]
    assert facts[0]["placements"] == ["S(0)"] and facts[0]["mesh_dims"] == ["dp_shard_cp"]
    assert [f["steps"] for f in facts] == [8, 8]  # 64 samples / (4 x 2 ranks)
    assert facts[0]["max_difference"] < 1e-6


@pytest.mark.parametrize("sizes", [{"dp_replicate_size": 2}, {}])
def test_replication_alone_is_ddp(run2, sizes):
    facts = layout(run2, **sizes)
    assert [f["strategy"] for f in facts] == ["DDPStrategy"] * 2
    assert [f["data_parallel"] for f in facts] == [[2, 0], [2, 1]]
    assert facts[0]["max_difference"] < 1e-6


def test_tp_splits_layers_and_shares_batches(run2):
    facts = layout(run2, tp_size=2)
    assert [f["data_parallel"] for f in facts] == [[1, 0], [1, 0]]  # both ranks, same batches
    assert [f["steps"] for f in facts] == [16, 16]
    assert facts[0]["mesh_dims"] == ["dp_shard_cp", "tp"] and facts[0]["placements"][-1] == "S(0)"
    assert facts[0]["max_difference"] < 1e-6


def test_hsdp_replicates_shard_groups_and_round_trips_dcp(run4):
    facts = layout(run4, dp_replicate_size=2, dp_shard_size=2)
    assert [f["data_parallel"] for f in facts] == [[4, r] for r in range(4)]
    assert facts[0]["placements"] == ["R", "S(0)"]
    assert facts[0]["mesh_dims"] == ["dp_replicate", "dp_shard"]
    assert [f["steps"] for f in facts] == [4] * 4
    assert all(f["resume_equal"] for f in facts)
    assert facts[0]["max_difference"] < 1e-6


def test_fsdp_times_tp_on_four_processes(run4):
    facts = layout(run4, dp_shard_size=2, tp_size=2)
    # tp peers are neighbouring ranks: 0,1 read data rank 0's batches, 2,3 data rank 1's
    assert [f["data_parallel"] for f in facts] == [[2, 0], [2, 0], [2, 1], [2, 1]]
    assert facts[0]["mesh_dims"] == ["dp_shard_cp", "tp"]
    assert facts[0]["max_difference"] < 1e-6


@pytest.mark.parametrize("world", [2, 4])
def test_rank_properties_are_the_meshs_local_ranks(run2, run4, world):
    """``accelerator.data_parallel_rank`` / ``data_parallel_shard_rank`` / ``tensor_parallel_rank``
    / ``context_parallel_rank`` equal ``torch_device_mesh.get_local_rank`` of their dimension on
    every rank; pure replication has no mesh and its data-parallel rank is the process's."""
    run = run2 if world == 2 else run4
    checked = 0
    for name, facts in run.items():
        if name == "{}":
            continue
        for rank, fact in enumerate(facts):
            if fact["mesh_ranks"] is None:
                assert fact["ranks"] == {"dp_replicate": rank, "dp_shard": 0, "cp": 0, "tp": 0}
            else:
                assert fact["ranks"] == fact["mesh_ranks"], (name, rank)
            checked += 1
    assert checked == (6 if world == 2 else 8)
