"""What a Lightning user's DDP code calls on the strategy, and ``rank_zero_only.rank``, on 2 real
processes (torchrun, gloo on CPU) as on Lightning 2.6; ``sync_dist=True`` logged on one rank
only ends the job with a ConfigurationError on both ranks instead of hanging. The one-process
behaviour of the same verbs is checked in this process."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.distributed.launch import ROOT, output_tail, torchrun
from trainer.errors import StrategyError
from trainer.strategies import SingleDeviceStrategy
from trainer.utilities import launcher_rank, rank_zero_only

WORKER = ROOT / "tests/distributed/strategy_api_worker.py"
# A hang (the bug this guards against) fails the test after this long instead of blocking CI.
JOB_TIMEOUT = 240


def _run(framework: str, out, scenario: str) -> list[dict]:
    try:
        result = torchrun(str(WORKER), framework, str(out), scenario, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{framework} {scenario}: the 2-process job hung ({JOB_TIMEOUT} s)")
    assert result.returncode == 0, output_tail(result)
    return [json.loads((out / f"{framework}{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
def test_strategy_verbs_and_rank_zero_only_as_on_lightning(tmp_path):
    """Found by this comparison: ``rank_zero_only.rank`` was None on every rank (Lightning's is
    the global rank: read at import, set again by the strategy); ``strategy.reduce`` did not
    exist; ``strategy.barrier("name")`` and ``all_gather(t, group=None, sync_grads=False)`` were
    refused (TypeError). Later: ``self.all_gather(3.5)`` returned the number (Lightning: a
    tensor of shape [2]); ``strategy.num_nodes`` / ``num_processes`` / ``parallel_devices`` were
    missing and ``process_group_backend`` was None (Lightning: "gloo")."""
    pytest.importorskip("lightning.pytorch")
    expected = _run("lightning", tmp_path, "api")
    ours = _run("trainer", tmp_path, "api")
    for rank in range(2):
        after_accelerator = ours[rank].pop("rank_after_accelerator")
        assert ours[rank] == expected[rank], f"rank {rank}"
        # Lightning's values, spelled out: what the comparison pins
        assert ours[rank]["rank_at_import"] == [rank, "int"]
        assert ours[rank]["rank_in_fit"] == rank  # reset from the stale value assigned before fit
        assert after_accelerator == rank  # the Accelerator's process setup resets it too
        assert ours[rank]["rank_zero_only_ran"] == ("ran" if rank == 0 else None)
        assert ours[rank]["reduce"] == {
            "mean": [1.5], "avg": [1.5], "AVG": [1.5], "sum": [3.0], "SUM": [3.0],
            "max": [2.0], "min": [1.0],
        }  # fmt: skip
        assert ours[rank]["reduce_group"] == [[3.0], [1.5]]
        assert ours[rank]["reduce_not_a_tensor"] == [3.5, "text", {"a": rank}]
        assert ours[rank]["broadcast"] == [{"from": 1}, "rank0", [2.0]]
        assert ours[rank]["all_gather_sync_grads"] == [[[1.0], [2.0]], [3.0]]
        assert ours[rank]["strategy_facts"] == [1, 2, ["cpu", "cpu"], "gloo"]
        assert ours[rank]["module_all_gather_numbers"] == [
            [[0.5, 1.5], "torch.float32"], [[3, 3], "torch.int32"], [[1, 1], "torch.uint8"]
        ]  # fmt: skip


@pytest.mark.distributed
@pytest.mark.parametrize("hook", ["training_step", "on_validation_epoch_end"])
def test_sync_dist_logged_on_one_rank_raises_on_both_ranks(tmp_path, hook):
    """Rank 1 logs a ``sync_dist=True`` epoch value in ``hook``, rank 0 logs no synced name. Rank
    0 skipped the names check and rank 1 waited in it: the job hung at the epoch's end. Now every
    rank checks and both raise the ConfigurationError naming each rank's names."""
    name = "only_rank1" if hook == "training_step" else "val_only_rank1"
    errors = _run("trainer", tmp_path, hook)
    for error in errors:
        assert error["type"] == "ConfigurationError", errors
        assert f"rank 0: []; rank 1: ['{name}']" in error["message"]
        assert "Log the same names on every rank" in error["message"]


# ---- one process: the same verbs, Lightning's SingleDeviceStrategy behaviour ---------------------


def test_rank_zero_only_rank_is_an_int_from_the_launcher_at_import():
    assert type(rank_zero_only.rank) is int
    assert rank_zero_only.rank == (launcher_rank() or 0)


def test_an_assigned_rank_zero_only_rank_is_used(monkeypatch):
    report = rank_zero_only(lambda: "ran", default="skipped")
    assert report() == "ran"
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert report() == "skipped"


def test_single_device_reduce_returns_its_input():
    strategy = SingleDeviceStrategy("cpu")
    value = torch.tensor([2, 3])
    for op in ("mean", "avg", "sum", "SUM", "max", "min", torch.distributed.ReduceOp.SUM):
        assert strategy.reduce(value, reduce_op=op) is value
    assert strategy.reduce(value, group=None) is value
    marker = object()
    assert strategy.reduce(marker) is marker  # not a tensor: as it is, as Lightning


def test_reduce_refuses_an_unknown_op_naming_the_known_ones():
    with pytest.raises(StrategyError, match=r"reduce_op='median'.*'mean' \(or 'avg'\), 'sum'"):
        SingleDeviceStrategy("cpu").reduce(torch.tensor(1.0), reduce_op="median")


def test_single_device_barrier_broadcast_and_all_gather_take_lightnings_arguments():
    strategy = SingleDeviceStrategy("cpu")
    strategy.barrier("before_save")
    strategy.barrier(name="after_save")
    assert strategy.broadcast({"a": 1}, src=0) == {"a": 1}
    gathered = strategy.all_gather(torch.tensor([1.0, 2.0]), group=None, sync_grads=True)
    assert gathered.tolist() == [[1.0, 2.0]]
