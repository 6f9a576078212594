"""Exact resume of augmenting data pipelines on 2 real processes (torchrun, DDP, gloo on CPU).

Each rank's resumed run sees, at every step, the batch the uninterrupted run saw, bit for bit,
and ends with equal weights: map-style data with 2 workers (persistent or not), an iterable
stream read in the main process, and torchdata's StatefulDataLoader sharded across the ranks;
an Accelerator's save_state / load_state carrying each rank's StatefulDataLoader position; and
two train loaders read together (a dict), resumed while the shorter one is in its second pass.
No rank forks itself: the loaders' workers start from a forkserver (see resume_data_worker.py).
"""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import ROOT, torchrun
from tests.distributed.resume_data_worker import SCENARIOS

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> list[dict]:
    pytest.importorskip("torchdata")
    out = tmp_path_factory.mktemp("resume_data")
    result = torchrun(str(ROOT / "tests/distributed/resume_data_worker.py"), str(out), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_no_rank_forks_its_training_process(facts):
    """Loader workers come from a forkserver: a fork of a process running gloo's threads can hang
    the child on CPython 3.11.7 (python/cpython#112275), and the loader waits for it for ever."""
    assert [rank_facts["forks"] for rank_facts in facts] == [0, 0]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_rank_resumes_with_the_same_batches_and_weights(facts, name):
    for rank_facts in facts:
        found = rank_facts[name]
        assert found["resumed_steps"][0] == 14  # stopped at 13
        assert found["differing_steps"] == []  # none differs, none is missing or extra
        assert found["weights_equal"]
    assert facts[0][name]["first_batch"] != facts[1][name]["first_batch"]  # sharded


def test_map_style_resumes_read_nothing_again(facts):
    for rank_facts in facts:
        for name in ("map_workers", "map_persistent", "map_stateful"):
            assert rank_facts[name]["resumed_steps"] == list(range(14, 21))  # 20 steps in all
            assert rank_facts[name]["produced"] == rank_facts[name]["consumed"] == 7 * 4


def test_accelerator_carries_each_ranks_stateful_loader_position(facts):
    for rank_facts in facts:
        assert rank_facts["accelerator"]["batches_equal"]
        assert rank_facts["accelerator"]["produced"] == 3 * 4  # nothing read again


def test_two_train_loaders_read_together_resume_exactly_on_every_rank(facts):
    """A dict of train loaders ("max_size_cycle"), stopped while the shorter one is in its second
    pass of the epoch: every resumed step sees the uninterrupted run's batches on every rank."""
    for rank_facts in facts:
        found = rank_facts["combined"]
        assert found["resumed_steps"] == list(range(14, 21))
        assert found["differing_steps"] == []
        assert found["weights_equal"]
        assert found["batch_sizes"] == [16]  # 4 + 12 (even_batches fills each rank's last 12)
    assert facts[0]["combined"]["first_batch"] != facts[1]["combined"]["first_batch"]
