"""Run the parity worker for both frameworks, read the facts it wrote, compare them.

`launch` starts both frameworks' workers for ``N`` processes at once (one process each, or
``torchrun --nproc_per_node N``), in their own sessions, killed as a group on a timeout.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "accelerate_parity" / "worker.py"
FRAMEWORKS = ("accelerate", "trainer")
LAUNCH_TIMEOUT = 300  # seconds for both frameworks' launches together
# torchrun's and a launcher's variables: a worker started from inside a distributed job must
# not join it.
_INHERITED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

Facts = list[dict[str, Any]]  # one {scenario: facts} per rank


def _command(framework: str, world: int, out: Path) -> list[str]:
    if world == 1:
        return [sys.executable, str(WORKER), framework, str(out)]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, "--nproc_per_node", str(world), str(WORKER), framework, str(out)]


def _read(out: Path, world: int) -> Facts:
    ranks = []
    for rank in range(world):
        payload = json.loads((out / f"rank{rank}.json").read_text(encoding="utf-8"))
        facts = payload["facts"]
        if "_aborted" in facts:
            facts = {**facts, "_aborted_reason": facts.pop("_aborted")}
        ranks.append(facts)
    return ranks


def launch(world: int, root: Path) -> dict[str, Facts]:
    """Run both frameworks' workers with ``world`` processes, side by side; their facts."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    outs = {framework: root / f"{framework}-{world}" for framework in FRAMEWORKS}
    running = {}
    for framework, out in outs.items():
        running[framework] = subprocess.Popen(
            _command(framework, world, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    failures = []
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    for framework, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Its own session: the workers go too, not only the torchrun agent.
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            failures.append(f"{framework}: timed out after {LAUNCH_TIMEOUT} s")
        if process.returncode != 0:
            failures.append(
                f"{framework} exited {process.returncode}:\n{stdout[-2000:]}{stderr[-4000:]}"
            )
    if failures:
        pytest.fail("\n".join(failures))
    return {framework: _read(out, world) for framework, out in outs.items()}


def fact(facts: Facts, rank: int, scenario: str) -> Any:
    """One scenario's facts on one rank; a scenario the worker did not reach says why."""
    ranked = facts[rank]
    if scenario not in ranked:
        return {"error": f"not run: {ranked.get('_aborted_reason', 'unknown scenario')}"}
    return ranked[scenario]


def differences(received: Any, expected: Any, path: str = "") -> list[str]:
    """Where ``received`` differs from ``expected``; floats within 1e-6 (relative or absolute)."""
    if isinstance(expected, float) or isinstance(received, float):
        if (
            isinstance(received, int | float)
            and isinstance(expected, int | float)
            and math.isclose(received, expected, rel_tol=1e-6, abs_tol=1e-6)
        ):
            return []
        return [f"{path or '.'}: {received!r} != {expected!r}"]
    if isinstance(expected, dict) and isinstance(received, dict):
        if received.keys() != expected.keys():
            return [f"{path or '.'}: keys {sorted(received)} != {sorted(expected)}"]
        return [d for k in expected for d in differences(received[k], expected[k], f"{path}.{k}")]
    if isinstance(expected, list) and isinstance(received, list):
        if len(received) != len(expected):
            return [
                f"{path or '.'}: {len(received)} items != {len(expected)}: {received!r:.300} vs {expected!r:.300}"
            ]
        return [
            d
            for i, (r, e) in enumerate(zip(received, expected))
            for d in differences(r, e, f"{path}[{i}]")
        ]
    return (
        [] if received == expected else [f"{path or '.'}: {received!r:.400} != {expected!r:.400}"]
    )


def assert_same(received: Any, expected: Any, where: str) -> None:
    """trainer's facts equal Accelerate's (which must not be an error: that is a suite bug)."""
    if isinstance(expected, dict) and "error" in expected:
        pytest.fail(f"{where}: the Accelerate side failed, fix the scenario: {expected['error']}")
    found = differences(received, expected)
    assert not found, f"{where}: trainer differs from Accelerate:\n" + "\n".join(found[:12])
