"""Fault matrix, part 1: ``kill -9`` at many points of a checkpoint save (issue #13).

One traced run lists the filesystem operations of the save at step 8 (files opened for writing,
fsyncs, renames, deletions of rotated checkpoints and of the replaced ``last``). The job is then
SIGKILLed at evenly spaced points of that list and once right after the save. After each kill:
every folder left in the checkpoint directory verifies, or is a temporary one that resume
ignores (a rotated checkpoint is renamed to a temporary name before its files are deleted, so a
kill inside that deletion leaves no half checkpoint under a real name); ``fit(ckpt_path="last")``
ends with exactly the uninterrupted run's weights, and its saves remove the killed run's
temporary folders.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.checkpoint.atomic import is_temporary
from trainer.checkpoint.format import verify_checkpoint

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "faults" / "kill_job.py"
KILL_POINTS = 11  # plus the kill right after the save: 12 cases

pytestmark = pytest.mark.slow


def run_job(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(JOB), str(root), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict[str, torch.Tensor], list[tuple[str, int]]]:
    """The uninterrupted run's final weights, and the save's operations as (op, n-th of op)."""
    root = tmp_path_factory.mktemp("trace")
    traced = run_job(root, "trace")
    assert traced.returncode == 0, traced.stderr[-3000:]
    counts: dict[str, int] = {}
    operations = []
    for line in traced.stdout.splitlines():
        op, _, _ = line.partition("\t")
        counts[op] = counts.get(op, 0) + 1
        operations.append((op, counts[op]))
    assert len(operations) >= KILL_POINTS, operations
    return load_file(str(root / "final-trace.safetensors")), operations


def kill_points() -> list[int]:
    """Indices into the traced operations (evenly spaced, first and last included), and -1."""
    return [*range(KILL_POINTS), -1]


@pytest.mark.parametrize("point", kill_points())
def test_kill_during_save_leaves_valid_or_temporary_folders_and_resumes_exactly(
    tmp_path, reference, point
):
    weights, operations = reference
    if point == -1:
        op, n, where = "after-save", 0, "right after the save returned"
        killed = run_job(tmp_path, "kill", "open", "0")
    else:
        index = round(point * (len(operations) - 1) / (KILL_POINTS - 1))
        op, n = operations[index]
        where = f"at {op} #{n} (operation {index + 1} of {len(operations)})"
        killed = run_job(tmp_path, "kill", op, str(n))
    assert killed.returncode == -signal.SIGKILL, (where, killed.stderr[-3000:])

    checkpoints = tmp_path / "checkpoints"
    for entry in sorted(checkpoints.iterdir()):
        if is_temporary(entry.name):
            continue  # unfinished or retired: ignored by resume (and cleaned by later saves)
        if entry.is_dir():
            verify_checkpoint(entry)  # raises CheckpointError when torn or corrupt

    resumed = run_job(tmp_path, "resume")
    assert resumed.returncode == 0, (where, resumed.stderr[-3000:])
    leftovers = [entry.name for entry in checkpoints.iterdir() if is_temporary(entry.name)]
    assert not leftovers, f"the resumed run's saves did not remove {leftovers} (kill {where})"
    final = load_file(str(tmp_path / "final-resume.safetensors"))
    assert final.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(final[name], tensor), f"{name} differs after a kill {where}"
