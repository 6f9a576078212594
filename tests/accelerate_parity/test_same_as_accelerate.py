"""Every scenario, 1 and 2 processes: trainer's facts equal Accelerate's, rank by rank.

The scenarios are in ``scenarios_*.py``; ``expectations.py`` lists the ones that are known gaps
(expected to fail) or deliberate differences (compared in ``test_differences.py`` instead).
"""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")

from tests.accelerate_parity import scenarios_api, scenarios_data, scenarios_ops, scenarios_training
from tests.accelerate_parity.expectations import is_different, known_gap
from tests.accelerate_parity.facts import assert_same, fact
from tests.accelerate_parity.kit import SCENARIOS

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
_MODULES = (
    scenarios_api,
    scenarios_data,
    scenarios_ops,
    scenarios_training,
)  # imported: they register


def _cases() -> list[object]:
    cases = []
    for world in (1, 2):
        for name in SCENARIOS:
            if is_different(name, world):
                continue
            reason = known_gap(name, world)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(name, world, marks=marks, id=f"{world}p-{name}"))
    return cases


@pytest.mark.parametrize(("scenario", "world"), _cases())
def test_same_as_accelerate(parity_facts, scenario: str, world: int) -> None:
    expected, received = parity_facts("accelerate", world), parity_facts("trainer", world)
    for rank in range(world):
        assert_same(
            fact(received, rank, scenario),
            fact(expected, rank, scenario),
            f"{scenario} ({world} processes, rank {rank})",
        )
