"""trainer/checkpoint/codec.py: what state.json holds comes back as it was saved."""

from __future__ import annotations

import enum
import json
import math
import random
import sys
from typing import Any

import numpy as np
import pytest
import torch

from trainer.checkpoint.codec import decode, encode


class _Level(enum.IntEnum):
    LOW = 1


def _round_trip(value: Any) -> Any:
    sink: dict[str, torch.Tensor] = {}
    text = json.dumps(encode(value, sink, "state"), separators=(",", ":"))
    return decode(json.loads(text), sink)


@pytest.mark.parametrize(
    "value",
    [
        [1, 2, 3],
        (1, "a", True, None),
        ["a", "b"],
        [],
        (),
        [1.5, -2.0, 3],
        [True, False, None],
        [1, [2, (3, 4)], {"k": (5,)}],
        {"nested": [(1, 2), ("x", None)], "empty": ((),)},
        [math.inf, 1.0, -math.inf],
        (b"raw", 1),
        [{1, 2}, frozenset({"a"})],
        {"by_int": {1: (2, 3)}},
    ],
    ids=repr,
)
def test_plain_and_mixed_sequences_come_back_equal_and_of_their_type(value: Any) -> None:
    back = _round_trip(value)
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, list | tuple):
        assert [type(item) for item in back] == [type(item) for item in value]


def test_a_nan_inside_a_list_of_numbers_is_kept() -> None:
    back = _round_trip([1.0, math.nan, 2])
    assert back[0] == 1.0 and math.isnan(back[1]) and back[2] == 2 and type(back[2]) is int


def test_an_int_enum_in_a_list_is_stored_as_its_int() -> None:
    assert _round_trip([_Level.LOW, 2]) == [1, 2]


def test_the_generators_states_come_back_and_replay_the_same_numbers() -> None:
    random.seed(7)
    np.random.seed(7)
    saved = {"python": random.getstate(), "numpy": np.random.get_state()}
    back = _round_trip(saved)
    expected = (random.random(), np.random.rand())
    random.setstate(back["python"])
    np.random.set_state(back["numpy"])
    assert (random.random(), np.random.rand()) == expected


def _calls(function: Any) -> int:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "call"

    sys.setprofile(profile)
    try:
        function()
    finally:
        sys.setprofile(None)
    return count


def test_pythons_rng_state_is_stored_without_a_call_per_number() -> None:
    # 625 ints: one call each made a 2,762-parameter model's checkpoint spend most of its
    # state.json time here; a list of plain values is copied in one pass now.
    state = random.getstate()
    encoded = encode(state, {}, "rng")
    assert _calls(lambda: encode(state, {}, "rng")) < 20
    assert _calls(lambda: decode(encoded, {})) < 20
