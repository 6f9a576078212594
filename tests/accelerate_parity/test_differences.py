"""The deliberate differences from Accelerate 1.15, each pinned: what each side does.

These are the scenarios ``expectations.DIFFERENT`` keeps out of the one-to-one comparison; each
is listed in docs/migration/accelerate.md. Where trainer promises more than Accelerate (a resume
that replays exactly), the promise is checked here too.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("accelerate")

from tests.accelerate_parity.expectations import DIFFERENT, known_gap
from tests.accelerate_parity.facts import Facts, fact

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _both(parity_facts, world: int) -> tuple[Facts, Facts]:
    return parity_facts("accelerate", world), parity_facts("trainer", world)


def _values(result: Any) -> Any:
    """A gathered / reduced tensor's values (its JSON form), or the error it raised."""
    return result["tensor"] if isinstance(result, dict) and "tensor" in result else result


def _interleaved(facts: Facts, scenario: str, epoch: int) -> list[int]:
    """The global order of one epoch: each step's batches (or slices) from rank 0, 1, ... in turn."""
    per_rank = [fact(facts, rank, scenario)["epochs"][epoch] for rank in range(len(facts))]
    steps = zip(*per_rank)  # the ranks step together (even_batches)
    return [i for step in steps for batch in step for i in batch]


# ---- shuffling: trainer's own order ----------------------------------------------------------
ORDERS = [
    ("batch_order/shuffle", 2, 10),
    ("batch_order/shuffle_split_batches", 2, 12),
    ("batch_order/seedable_sampler", 1, 10),
    ("batch_order/seedable_sampler", 2, 10),
]


@pytest.mark.parametrize(("scenario", "world", "n"), ORDERS)
def test_shuffle_deals_one_permutation_per_epoch(parity_facts, scenario, world, n) -> None:
    """Both: every epoch is one permutation dealt to the processes, new each epoch, with the same
    batch sizes; only the permutation itself differs."""
    accelerate, trainer = _both(parity_facts, world)
    for facts in (accelerate, trainer):
        orders = [_interleaved(facts, scenario, epoch) for epoch in (0, 1)]
        for order in orders:
            assert sorted(order[:n]) == list(range(n)), order
            assert set(order[n:]) <= set(order[:n])  # even_batches repeats early samples
        assert orders[0] != orders[1]
    for rank in range(world):
        sizes = [[len(b) for b in epoch] for epoch in fact(accelerate, rank, scenario)["epochs"]]
        assert [[len(b) for b in e] for e in fact(trainer, rank, scenario)["epochs"]] == sizes


@pytest.mark.parametrize("world", [1, 2])
def test_seedable_sampler_replays_after_set_epoch(parity_facts, world) -> None:
    """Accelerate's check_seedable_sampler: the same seed and ``set_epoch(0)`` replay the epochs."""
    for facts in _both(parity_facts, world):
        for rank in range(world):
            assert fact(facts, rank, "batch_order/seedable_set_epoch_replays")["replayed_equal"]


@pytest.mark.parametrize(
    ("scenario", "world"),
    [
        ("train/shuffled", 2),
        ("train/shuffled_dropout_evaluate", 2),
        ("train/seedable_sampler", 1),
        ("train/seedable_sampler", 2),
        ("training_check/plain_shuffle", 2),
    ],
)
def test_shuffled_training_has_the_same_shape(parity_facts, scenario, world) -> None:
    """Different permutations give different losses; the steps, the evaluation set sizes and the
    replicas' agreement are the same."""
    accelerate, trainer = _both(parity_facts, world)
    for rank in range(world):
        expected, received = fact(accelerate, rank, scenario), fact(trainer, rank, scenario)
        assert len(received.get("losses", [])) == len(expected.get("losses", []))
        assert [c for c, _ in received.get("eval", [])] == [c for c, _ in expected.get("eval", [])]
        assert len(received["params"]) == len(expected["params"])
    for facts in (accelerate, trainer):
        assert all(
            fact(facts, r, scenario)["params"] == fact(facts, 0, scenario)["params"]
            for r in range(world)
        )


def test_two_process_shuffled_metrics_cover_the_dataset_once(parity_facts) -> None:
    scenario = "gather_for_metrics/tensor_9_by_2_shuffled"
    for facts in _both(parity_facts, 2):
        steps = [_values(step) for step in fact(facts, 0, scenario)["steps"]]
        assert [len(step) for step in steps] == [4, 4, 1]
        assert sorted(i for step in steps for i in step) == list(range(9))


@pytest.mark.parametrize("side", ["accelerate", "trainer"])
def test_seedable_two_processes_end_where_one_process_does(parity_facts, side) -> None:
    """Same global batch, seedable sampler: the 2-process weights equal the 1-process weights,
    on both sides (Accelerate's plain shuffle does not: its order depends on N)."""
    scenario = "training_check/seedable_sampler"
    alone = fact(parity_facts(side, 1), 0, scenario)["params"]
    for rank in range(2):
        two = fact(parity_facts(side, 2), rank, scenario)["params"]
        gap = max(abs(a - b) for a, b in zip(alone, two))
        assert gap <= 1e-5, f"{side}: 2 processes end {gap} away from 1 process"


# ---- resume --------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize(
    "case",
    [
        "epoch_end",
        "epoch_end_dropout",
        "epoch_end_seedable",
        "mid_epoch_seedable",
        "unshuffled_dropout",
        "unshuffled_mid_epoch",
        "mid_epoch_data_seed",
    ],
)
def test_trainer_resume_replays_the_uninterrupted_run(parity_facts, case, world) -> None:
    """trainer: a run stopped after ``save_state`` and resumed with ``load_state`` has the losses
    and final weights of the run that went on. Accelerate 1.15 does so on one process except
    with the seedable sampler at an epoch end (it restarts the sampler's epoch), and on two
    processes only mid-epoch with the seedable sampler (its shuffling generator is not saved)."""
    scenario = f"resume/{case}"
    for rank in range(world):
        received = fact(parity_facts("trainer", world), rank, scenario)
        expected = fact(parity_facts("accelerate", world), rank, scenario)
        assert received["resumed"] == received["uninterrupted"]
        assert received["resumed_ids"] == received["uninterrupted_ids"]
        assert received["params_equal"] is True
        assert received["counter_loaded"] == expected["counter_loaded"]
        assert len(received["resumed"]) == len(expected["resumed"])


@pytest.mark.parametrize(
    ("world", "case", "exact"),
    [
        (1, "epoch_end", True),
        (1, "mid_epoch_seedable", True),
        (2, "mid_epoch_seedable", True),
        (2, "unshuffled_dropout", True),
        (1, "epoch_end_seedable", False),
        (2, "epoch_end_seedable", False),
        (2, "epoch_end", False),
        (2, "epoch_end_dropout", False),
    ],
)
def test_accelerate_resume_is_exact_only_there(parity_facts, world, case, exact) -> None:
    """The Accelerate side of the difference above (pinned: the migration guide says so). Where
    it is not exact, the resumed run reads the first epoch's order again."""
    for rank in range(world):
        facts = fact(parity_facts("accelerate", world), rank, f"resume/{case}")
        assert facts["params_equal"] is exact
        assert (facts["resumed_ids"] == facts["uninterrupted_ids"]) is exact
        if not exact:
            first = len(facts["before_save_ids"])
            assert facts["resumed_ids"][:first] == facts["before_save_ids"]


@pytest.mark.parametrize("world", [1, 2])
def test_a_save_in_the_epochs_last_batch_resumes_at_the_next_epoch(parity_facts, world) -> None:
    """``save_state`` inside the loop at the epoch's last batch, then a plain loop over the
    loader after ``load_state``: trainer replays the next epochs on 1 and 2 processes (it read
    the saved epoch's order again before); Accelerate 1.15 does on one process only."""
    scenario = "resume/saved_in_the_epochs_last_batch"
    for rank in range(world):
        assert fact(parity_facts("trainer", world), rank, scenario)["replayed"] is True
        assert fact(parity_facts("accelerate", world), rank, scenario)["replayed"] is (world == 1)


# ---- gradient state, processes ------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2])
def test_break_ends_the_iteration_in_trainer(parity_facts, world) -> None:
    """After ``break``, trainer's loader is no longer active (Accelerate keeps it active, with its
    last end-of-data flag, until the next iteration starts); the next full pass is the same."""
    accelerate, trainer = _both(parity_facts, world)
    for rank in range(world):
        expected = fact(accelerate, rank, "gradient_state/break_and_restart")
        received = fact(trainer, rank, "gradient_state/break_and_restart")
        assert received["after_break"] == [False, False]
        assert expected["after_break"][0] is True
        assert received["restart_end_flags"] == expected["restart_end_flags"]
        assert received["after"] == expected["after"] is False


def test_batch_sampler_as_sampler_on_one_process(parity_facts) -> None:
    """``DataLoader(sampler=BatchSampler(...), batch_size=None)``: Accelerate 1.15 raises a
    TypeError on one process (it shards it on two, as trainer does); trainer yields the batches."""
    accelerate, trainer = _both(parity_facts, 1)
    assert (
        "got multiple values"
        in fact(accelerate, 0, "batch_order/batch_sampler_as_sampler")["error"]
    )
    batches = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    received = fact(trainer, 0, "batch_order/batch_sampler_as_sampler")
    assert received["epochs"] == [batches, batches]
    assert received["len"] == 4


# ---- collectives ----------------------------------------------------------------------------
def _xfail_if_gap(scenario: str, world: int) -> list[Any]:
    reason = known_gap(scenario, world)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def _params(scenarios: list[str], world: int) -> list[Any]:
    return [pytest.param(s, marks=_xfail_if_gap(s, world), id=s) for s in scenarios]


@pytest.mark.parametrize(
    "scenario", _params(["ops/gather_method/scalar", "ops/gather_function/scalar"], 1)
)
def test_gather_of_a_0_dim_tensor_on_one_process(parity_facts, scenario) -> None:
    """trainer returns shape (1,) with any number of processes; Accelerate returns the 0-dim
    tensor unchanged on one process (shape (N,) on N)."""
    accelerate, trainer = _both(parity_facts, 1)
    assert fact(accelerate, 0, scenario)["shape"] == []
    assert fact(trainer, 0, scenario) == {"tensor": [0.5], "dtype": "float32", "shape": [1]}


@pytest.mark.parametrize(
    "scenario", _params(["ops/reduce_method/min", "ops/reduce_function/min"], 2)
)
def test_reduce_min_is_the_minimum(parity_facts, scenario) -> None:
    """Accelerate 1.15 all-reduces "min" with SUM (only "max" maps to MAX); trainer takes the
    element-wise minimum, as the name says."""
    accelerate, trainer = _both(parity_facts, 2)
    for rank in range(2):
        assert _values(fact(accelerate, rank, scenario)) == [12.0, 14.0, 16.0]  # 1+11, 2+12, 3+13
        assert _values(fact(trainer, rank, scenario)) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("scenario", "world"),
    [
        pytest.param(s, w, marks=_xfail_if_gap(s, w), id=f"{w}p-{s}")
        for s in ("ops/reduce_method/sum_scale_2", "ops/reduce_function/sum_scale_2")
        for w in (1, 2)
    ],
)
def test_reduce_applies_scale(parity_facts, scenario, world) -> None:
    """``reduce(t, "sum", scale=2.0)``: trainer multiplies the result by ``scale``; Accelerate
    applies ``scale`` on XLA only and ignores it on CPU and GPU."""
    plain = [1.0, 2.0, 3.0] if world == 1 else [12.0, 14.0, 16.0]
    accelerate, trainer = _both(parity_facts, world)
    for rank in range(world):
        assert _values(fact(accelerate, rank, scenario)) == plain
        assert _values(fact(trainer, rank, scenario)) == [2 * v for v in plain]


@pytest.mark.parametrize(
    ("scenario", "plain"),
    [
        ("batch_order/dispatch_batches", "batch_order/plain"),
        ("batch_order/dispatch_batches_split", "batch_order/split_batches"),
        ("batch_order/iterable", "batch_order/plain"),
        ("batch_order/iterable_split_batches", "batch_order/split_batches"),
        ("batch_order/iterable_even_false", "batch_order/even_batches_false"),
    ],
)
def test_dispatch_batches_reads_per_process(parity_facts, scenario, plain) -> None:
    """trainer reads each process's share itself: the batches are those without dispatching.
    Accelerate dispatches (its default for an IterableDataset): the full rounds are the same;
    the last, short round is split among the processes, each sample once."""
    accelerate, trainer = _both(parity_facts, 2)
    last_round = []
    for rank in range(2):
        received = fact(trainer, rank, scenario)
        assert received["epochs"] == fact(trainer, rank, plain)["epochs"]
        expected = fact(accelerate, rank, scenario)["epochs"][0]
        assert expected[:-1] == received["epochs"][0][:-1]
        last_round += expected[-1]
    seen = {
        i
        for rank in range(2)
        for b in fact(accelerate, rank, scenario)["epochs"][0][:-1]
        for i in b
    }
    assert sorted(last_round) == sorted(set(range(10)) - seen)


@pytest.mark.parametrize("world", [1, 2])
def test_a_free_prepare_data_loader_loader_has_its_own_gradient_state(parity_facts, world) -> None:
    """Accelerate's process-wide GradientState sees a ``prepare_data_loader`` loader end; here an
    Accelerator's does not (it sees the loaders it prepared); the batches are the same."""
    accelerate, trainer = _both(parity_facts, world)
    scenario = "prepare_data_loader/accelerator_sees_the_end"
    for rank in range(world):
        expected, received = fact(accelerate, rank, scenario), fact(trainer, rank, scenario)
        assert received["epochs"] == expected["epochs"]
        assert expected["end_of_dataloader"][-1] is True
        assert not any(received["end_of_dataloader"])


@pytest.mark.parametrize("scenario", ["ops/reduce_method/none", "ops/reduce_function/none"])
def test_reduce_none_leaves_the_tensor(parity_facts, scenario) -> None:
    """``reduce(t, "none")``: trainer returns each process's tensor; Accelerate 1.15 sums."""
    accelerate, trainer = _both(parity_facts, 2)
    for rank in range(2):
        assert _values(fact(accelerate, rank, scenario)) == [12.0, 14.0, 16.0]
        assert _values(fact(trainer, rank, scenario)) == [
            1.0 + 10 * rank,
            2.0 + 10 * rank,
            3.0 + 10 * rank,
        ]


@pytest.mark.parametrize(
    ("scenario", "accelerate_result", "trainer_result"),
    [
        ("ops/gather_object/dict", ["rank", "rank"], [{"rank": 0}, {"rank": 1}]),
        ("ops/gather_object/string", ["r", "0", "r", "1"], ["r0", "r1"]),
    ],
)
def test_gather_object_of_a_non_list(
    parity_facts, scenario, accelerate_result, trainer_result
) -> None:
    """trainer gathers one item per process; Accelerate iterates the object and flattens it."""
    accelerate, trainer = _both(parity_facts, 2)
    for rank in range(2):
        assert fact(accelerate, rank, scenario) == accelerate_result
        assert fact(trainer, rank, scenario) == trainer_result


KEPT = ["_orig_mod.0.weight", "_orig_mod.0.bias", "_orig_mod.2.weight", "_orig_mod.2.bias"]


@pytest.mark.parametrize("world", [1, 2])
def test_unwrap_model_of_a_compiled_model(parity_facts, world: int) -> None:
    """``unwrap_model(model)``: trainer returns the module (its own state dict names), Accelerate
    the compiled wrapper (``_orig_mod.`` names). ``keep_torch_compile=True`` gives Accelerate's
    on one process; with DDP between, trainer refuses where Accelerate re-points the wrapper."""
    accelerate, trainer = _both(parity_facts, world)
    for rank in range(world):
        theirs = fact(accelerate, rank, "unwrap/compiled_default")
        ours = fact(trainer, rank, "unwrap/compiled_default")
        assert (theirs["default"], ours["default"]) == ("OptimizedModule", "Sequential")
        assert theirs["kept"] == ["OptimizedModule", KEPT]
        assert ours["kept"] == (["OptimizedModule", KEPT] if world == 1 else "ConfigurationError")


def test_every_difference_has_a_test() -> None:
    covered = {
        "batch_order/seedable_sampler", "batch_order/seedable_set_epoch_replays",
        "train/seedable_sampler", "training_check/seedable_sampler", "resume/mid_epoch_seedable",
        "batch_order/dispatch_batches*", "batch_order/iterable*",
        "prepare_data_loader/accelerator_sees_the_end", "ops/reduce_*/none",
        "ops/gather_object/dict", "ops/gather_object/string",
        "batch_order/shuffle", "batch_order/shuffle_split_batches", "train/shuffled",
        "train/shuffled_dropout_evaluate", "gather_for_metrics/tensor_9_by_2_shuffled",
        "training_check/plain_shuffle", "resume/epoch_end", "resume/epoch_end_dropout",
        "resume/epoch_end_seedable", "gradient_state/break_and_restart",
        "batch_order/batch_sampler_as_sampler", "ops/gather_method/scalar",
        "ops/gather_function/scalar", "ops/reduce_method/min", "ops/reduce_function/min",
        "ops/reduce_method/sum_scale_2", "ops/reduce_function/sum_scale_2",
        "unwrap/compiled_default", "resume/saved_in_the_epochs_last_batch",
    }  # fmt: skip
    assert set(DIFFERENT) == covered
