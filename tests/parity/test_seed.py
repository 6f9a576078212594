"""Parity by difference: ``seed_everything`` on lightning (``PL_GLOBAL_SEED``) and on trainer
(``TRAINER_GLOBAL_SEED``): the seed chosen, the warning, the variable written, the draws after."""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import trainer
from trainer.runtime.seed import SEED_ENV

lightning_seed = pytest.importorskip("lightning.fabric.utilities.seed")

_FRAMEWORKS: dict[str, tuple[Callable[..., int], str]] = {
    "lightning": (lightning_seed.seed_everything, "PL_GLOBAL_SEED"),
    "trainer": (trainer.seed_everything, SEED_ENV),
}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("PL_GLOBAL_SEED", SEED_ENV, "PL_SEED_WORKERS", "PYTHONHASHSEED"):
        monkeypatch.delenv(name, raising=False)
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def _seed(framework: str, monkeypatch: pytest.MonkeyPatch, env: str | None, *args: Any) -> dict:
    """Call seed_everything with ``env`` in the framework's variable; what a user observes."""
    function, variable = _FRAMEWORKS[framework]
    if env is not None:
        monkeypatch.setenv(variable, env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seed = function(*args)
    return {
        "seed": seed,
        "warnings": [str(w.message) for w in caught if "seed" in str(w.message).lower()],
        "env": os.environ.get(variable),
        "draws": (random.random(), float(np.random.rand()), float(torch.rand(1))),
    }


@pytest.mark.parametrize(
    ("env", "args"),
    [(None, ()), ("123", ()), (None, (7,)), ("5", (9,)), (None, (np.int64(3),)), (None, (4, True))],
    ids=["none", "from-env", "given", "given-wins", "numpy-int", "workers"],
)
def test_seed_everything_matches_lightning(
    monkeypatch: pytest.MonkeyPatch, env: str | None, args: tuple[Any, ...]
) -> None:
    expected = _seed("lightning", monkeypatch, env, *args)
    received = _seed("trainer", monkeypatch, env, *args)
    assert received == expected


@pytest.mark.parametrize(("env", "args"), [("abc", ()), (None, (-1,)), (None, (2**32,))])
def test_bad_seeds_are_refused_as_lightning_refuses_them(
    monkeypatch: pytest.MonkeyPatch, env: str | None, args: tuple[Any, ...]
) -> None:
    with pytest.raises(ValueError):
        _seed("lightning", monkeypatch, env, *args)
    with pytest.raises(trainer.ConfigurationError, match=SEED_ENV if env else "seed_everything"):
        _seed("trainer", monkeypatch, env, *args)
