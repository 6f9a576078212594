"""Accelerate's distributed operations as free functions (``from trainer import gather, ...``) and
the Accelerator's ``reduce`` with "max" / "min", on one process.

The 2-process behaviour of the same functions is in tests/distributed/test_missing_names.py.
"""

from __future__ import annotations

import collections
import inspect

import pytest
import torch

import trainer
from trainer import Accelerator, ConfigurationError
from trainer.accelerator import collectives, operations
from trainer.strategies import Strategy

FREE_FUNCTIONS = (
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "pad_across_processes",
    "reduce",
    "wait_for_everyone",
)

Pair = collections.namedtuple("Pair", ["left", "right"])


def _nest() -> dict:
    return {"a": [torch.tensor([1.0, 2.0]), (torch.tensor(3.0),)], "b": Pair(torch.ones(2, 2), 7)}


@pytest.mark.parametrize("name", FREE_FUNCTIONS)
def test_each_free_function_is_public_and_is_the_operations_one(name):
    assert getattr(trainer, name) is getattr(operations, name)
    assert name in trainer.__all__


@pytest.mark.parametrize("name", FREE_FUNCTIONS)
def test_signatures_are_accelerates(name):
    accelerate_utils = pytest.importorskip("accelerate.utils")
    theirs = inspect.signature(getattr(accelerate_utils, name)).parameters
    ours = inspect.signature(getattr(trainer, name)).parameters
    assert [(p.name, p.default) for p in ours.values()] == [
        (p.name, p.default) for p in theirs.values()
    ]


def test_one_process_uses_the_one_process_identities():
    strategy = operations.current_strategy()
    assert type(strategy) is Strategy and strategy.world_size == 1
    assert operations.current_strategy() is strategy  # built once


def test_reduce_free_default_is_mean_and_keeps_the_nest():
    data = _nest()
    data["b"] = Pair(torch.ones(2, 2), torch.tensor(7))  # reduce takes tensors only
    for reduction in ("mean", "sum", "max", "min", "none"):
        out = trainer.reduce(data, reduction=reduction)
        assert torch.equal(out["a"][0], data["a"][0]) and isinstance(out["a"][1], tuple)
        assert isinstance(out["b"], Pair) and int(out["b"].right) == 7
    assert inspect.signature(trainer.reduce).parameters["reduction"].default == "mean"
    assert torch.equal(
        trainer.reduce(torch.tensor([1.0, 3.0]), scale=2.0), torch.tensor([2.0, 6.0])
    )


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_accelerator_reduce_takes_max_and_min(reduction):
    # Failed before: "max" / "min" raised ConfigurationError.
    accelerator = Accelerator(cpu=True)
    tensor = torch.tensor([1.0, 3.0])
    out = accelerator.reduce(tensor, reduction)
    assert torch.equal(out, tensor) and out is not tensor  # a copy, as an all-reduce gives


def test_an_unknown_reduction_names_the_choices():
    with pytest.raises(ConfigurationError, match=r"reduction='median'.*'max', 'min'"):
        trainer.reduce(torch.ones(1), reduction="median")
    with pytest.raises(ConfigurationError, match="reduction='avg'"):
        Accelerator(cpu=True).reduce(torch.ones(1), "avg")


def test_reduce_of_a_python_number_names_the_call_and_asks_for_a_tensor():
    # Failed before: reduce(loss.item()) returned each process's own value, unreduced.
    # Accelerate raises TypeError, with one process too; NotATensorError is one.
    for reduce in (trainer.reduce, Accelerator(cpu=True).reduce):
        with pytest.raises(
            collectives.NotATensorError, match=r"^reduce\(tensor=0.5 .*Pass a tensor"
        ):
            reduce(0.5, "mean")
        with pytest.raises(TypeError, match=r"found 2.0 \(type float\) at \['b'\]\[0\]"):
            reduce({"a": torch.ones(1), "b": [2.0]}, "sum")
    assert issubclass(collectives.NotATensorError, ConfigurationError)


def test_gather_and_broadcast_of_python_numbers_raise_with_several_processes():
    # Failed before: each process got its own number back. With one process Accelerate
    # returns the value, as gather does here.
    assert trainer.gather([1.5]) == [1.5] and trainer.broadcast(1.5) == 1.5
    with pytest.raises(collectives.NotATensorError, match=r"^gather\(tensor=\[1.5\].*at \[0\]"):
        collectives.gather(_Pretend(), [1.5])
    with pytest.raises(TypeError, match=r"^broadcast\(tensor=1.5 .*Pass a tensor"):
        collectives.broadcast(_Pretend(), 1.5)


def test_gather_broadcast_and_pad_are_identities_with_one_process():
    data = _nest()
    gathered = trainer.gather(data)
    assert torch.equal(gathered["a"][0], data["a"][0])
    assert gathered["a"][1][0].shape == (1,)  # a 0-dim tensor counts as one row
    assert torch.equal(trainer.broadcast(data, from_process=0)["b"].left, torch.ones(2, 2))
    assert torch.equal(trainer.pad_across_processes(torch.ones(2, 3), dim=1), torch.ones(2, 3))
    assert trainer.wait_for_everyone() is None


def test_gather_object_is_the_object_itself_with_one_process():
    assert trainer.gather_object([1, "a"]) == [1, "a"]
    marker = {"x": 1}
    assert trainer.gather_object(marker) is marker


def test_broadcast_object_list_fills_the_list_and_refuses_a_tuple():
    items = [1, {"a": 2}]
    assert trainer.broadcast_object_list(items) is items
    with pytest.raises(ConfigurationError, match="expected a list"):
        trainer.broadcast_object_list((1, 2))


class _Pretend(Strategy):
    """Two processes as seen from rank 1: what the collectives receive from the strategy."""

    @property
    def world_size(self) -> int:
        return 2

    def all_gather_object(self, obj):
        return ["from rank 0", obj] if not isinstance(obj, list) else [["r0"], obj]

    def broadcast(self, obj, src=0):
        return ["sent", "by", src] if isinstance(obj, list) else obj


def test_gather_object_concatenates_lists_and_keeps_other_objects_whole():
    assert collectives.gather_object(_Pretend(), ["r1"]) == ["r0", "r1"]
    assert collectives.gather_object(_Pretend(), "x") == ["from rank 0", "x"]


def test_broadcast_object_list_replaces_the_items_in_place():
    items = [None, None]
    assert collectives.broadcast_object_list(_Pretend(), items, 1) is items
    assert items == ["sent", "by", 1]
