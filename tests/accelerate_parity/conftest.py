"""The session's parity facts: the worker runs once per process count, on first use.

The first test that needs ``N`` processes launches both frameworks' workers for ``N``
(`facts.launch`); every later test reads the JSON they wrote.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.accelerate_parity.facts import Facts, launch


@pytest.fixture(scope="session")
def parity_facts(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Facts]:
    """``parity_facts(framework, world)``: each rank's facts; launched on first use per world."""
    cache: dict[int, dict[str, Facts]] = {}

    def get(framework: str, world: int) -> Facts:
        if world not in cache:
            cache[world] = launch(world, tmp_path_factory.mktemp(f"accelerate_parity_{world}"))
        return cache[world][framework]

    return get
