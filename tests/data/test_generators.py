"""Generator states: seeded together, copied out and back exactly (numpy's raw fast path too)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from trainer.data.generators import (
    forget_generator_states,
    get_generator_states,
    seed_generators,
    set_generator_states,
)


def _draws() -> list[float]:
    return [torch.rand(()).item(), *np.random.randn(3).tolist(), random.random()]


@pytest.mark.parametrize("cached_gaussians", [0, 1])  # an odd count leaves one Gaussian cached
def test_states_come_back_exactly_after_any_draws_and_seeding(cached_gaussians):
    np.random.seed(3)
    np.random.randn(cached_gaussians)
    for _ in range(3):  # again and again: the second time numpy's raw copy is known good
        saved = get_generator_states()
        expected = _draws()
        set_generator_states(saved)
        seed_generators(12345)  # a batch read in between
        np.random.randn(1)  # which leaves a Gaussian of its own cached
        set_generator_states(saved)
        assert _draws() == expected


def test_a_portable_state_is_numpys_own():
    _, _, numpy_state = get_generator_states(portable=True)
    assert numpy_state[0] == "MT19937" and len(numpy_state[1]) == 624


def test_an_older_state_set_elsewhere_is_not_taken_for_a_known_one():
    """(raw R, a Gaussian cached) comes before (raw R, none cached) in a stream; after the
    second is known, setting the first back (a resume does) must still be copied in full."""
    np.random.seed(11)
    np.random.randn(1)  # raw R, one Gaussian cached
    older = get_generator_states(portable=True)
    np.random.randn(1)  # the cached one used: raw R, none cached
    set_generator_states(get_generator_states())  # now R is known
    np.random.set_state(older[2])  # elsewhere: the older state back
    forget_generator_states()
    saved = get_generator_states()
    expected = np.random.randn(2).tolist()
    set_generator_states(saved)
    assert np.random.randn(2).tolist() == expected
