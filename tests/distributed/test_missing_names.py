"""Accelerate's names on 2 real processes (torchrun, gloo): free operations, decorators,
triggers, ``trigger_sync_in_backward``, ``prepare_data_loader``, a ``BatchSampler`` as sampler,
a loader's own generator, and Accelerate's shuffled ``training_check`` (issue #15 item 8).

The job is tests/distributed/missing_names_worker.py; one-process checks of the same names are
in tests/test_accelerator_missing_names.py and tests/test_accelerator_operations.py.
"""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import ROOT, output_tail, torchrun

pytestmark = pytest.mark.distributed

# Accelerate's test_script.py compares with torch.testing.assert_close(atol=1e-6, rtol=1e-6).
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("missing_names")
    result = torchrun(str(ROOT / "tests/distributed/missing_names_worker.py"), str(out))
    assert result.returncode == 0, output_tail(result)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_a_free_collective_before_any_accelerator_joins_the_job(facts):
    assert [f["gather_before_accelerator"] for f in facts] == [2.0, 2.0]


def test_free_operations_act_on_the_current_process_group(facts):
    for rank, f in enumerate(facts):
        assert f["broadcast"] == [3.0, 4.0]  # from process 1
        assert f["gather_nest"] == [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]]
        assert f["gather_refuses_other"]  # a Python number among the tensors, as Accelerate
        assert f["gather_object_list"] == [0, "r0", 1, "r1"]
        assert f["gather_object_value"] == [{"rank": 0}, {"rank": 1}]
        assert f["broadcast_object_list"] == ["from 1", 1]
        assert f["reduce"] == {
            "mean": [2.0, 3.0],
            "sum": [4.0, 6.0],
            "max": [3.0, 4.0],
            "min": [1.0, 2.0],
            "none": [1.0 + 2 * rank, 2.0 + 2 * rank],
        }
        assert f["reduce_default"] == [2.0, 3.0]  # the free reduce's default is "mean"
        assert f["reduce_scaled"] == [2.0, 3.0]
        assert f["wait"] is None
    assert [f["pad"] for f in facts] == [[[1.0, 1.0], [-1.0, -1.0]], [[1.0, 1.0]] * 2]
    assert [f["pad_first"] for f in facts] == [[[0.0, 0.0], [1.0, 1.0]], [[1.0, 1.0]] * 2]


def test_accelerator_reduce_takes_max_and_min(facts):
    # Failed before: reduce(..., "max") raised.
    for f in facts:
        assert f["method_reduce"] == {"sum": [4.0, 6.0], "max": [3.0, 4.0], "min": [1.0, 2.0]}


def test_decorators_run_the_function_on_the_chosen_process_only(facts):
    first, second = (f["decorators"] for f in facts)
    assert (first["main"], second["main"]) == (0, None)
    assert (first["local_main"], second["local_main"]) == (0, None)
    assert (first["last"], second["last"]) == (None, 1)
    assert (first["process_1"], second["process_1"]) == (None, "ran")
    assert (first["process_0_direct"], second["process_0_direct"]) == (0, None)
    assert (first["local_0"], second["local_0"]) == ("ran", None)


def test_a_trigger_set_on_one_process_is_seen_by_all_once(facts):
    assert [f["decorators"]["checks"] for f in facts] == [[False, True, False]] * 2


def test_trigger_sync_in_backward_averages_what_no_sync_accumulated(facts):
    for f in facts:
        sync = f["forced_sync"]
        assert sync["grad"] == sync["expected"] != sync["local"]


def test_prepare_data_loader_without_an_accelerator_shares_out_by_rank(facts):
    assert [f["free"] for f in facts] == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]
    assert [f["free_len"] for f in facts] == [2, 2]
    assert [f["shuffled_all"] for f in facts] == [list(range(12))] * 2


def test_a_batch_sampler_as_sampler_is_sharded(facts):
    # Failed before: prepare refused a DataLoader with batch_size=None.
    parts = [f["batch_sampler_as_sampler"] for f in facts]
    assert [p["batches"] for p in parts] == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]
    assert [p["metrics"] for p in parts] == [list(range(10))] * 2  # duplicates dropped


def test_a_loaders_own_generator_is_synchronised_and_saved(facts):
    # The two processes seeded their generators differently: process 0's state is used.
    first = [f["own_generator"] for f in facts]
    assert first[0] == first[1]
    for epoch in ("first", "second"):
        assert sorted(i for batch in first[0][epoch] for i in batch) == list(range(16))
    assert first[0]["second_again"] == first[0]["second"]


@pytest.mark.parametrize("variant", ["training_check", "training_check_seedable"])
@pytest.mark.parametrize("split", ["split=False", "split=True"])
def test_shuffled_two_process_training_ends_with_the_one_process_weights(facts, variant, split):
    # Failed before (variant training_check): the 2-process run shuffled with its own seed
    # instead of the loader's generator, and ended with other weights.
    for f in facts:
        assert f[variant][split] <= TOLERANCE * (1 + abs(f[variant]["baseline_a"]))
