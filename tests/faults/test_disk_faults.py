"""Fault matrix, part 4: the disk refuses a save — full (``ulimit -f``) or read-only (#13).

A first run leaves checkpoints at steps 2, 4 and 6. A second run resumes from them in a
process whose disk refuses writes; its first save (step 8: the top-k checkpoint, or ``last``
when step 8's loss does not rank) must fail with a ``CheckpointError`` that names it, and every checkpoint written before must still be there and verify.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.checkpoint.atomic import is_temporary
from trainer.checkpoint.format import verify_checkpoint

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "faults" / "kill_job.py"

pytestmark = pytest.mark.slow


def job_command(root: Path, mode: str) -> list[str]:
    return [sys.executable, str(JOB), str(root), mode]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, **kwargs
    )


def checkpoints_after_first_half(root: Path) -> dict[str, float]:
    first = run(job_command(root, "first-half"))
    assert first.returncode == 0, first.stderr[-3000:]
    return snapshot(root / "checkpoints")


def snapshot(directory: Path) -> dict[str, float]:
    """The non-temporary entries, each verified, with their modification times."""
    entries = {}
    for entry in directory.iterdir():
        if is_temporary(entry.name):
            continue
        verify_checkpoint(entry)
        entries[entry.name] = entry.stat().st_mtime
    return entries


def assert_refused_and_intact(result: subprocess.CompletedProcess, root: Path, before) -> None:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "CheckpointError" in result.stderr, result.stderr[-3000:]
    # Step 8's first save: its top-k checkpoint when its loss ranks in the top 2, else `last`
    # (staged under a temporary name); which one depends on the losses, not on the fault.
    last_line = result.stderr.splitlines()[-1]
    assert "epoch=1-step=8" in last_line or ".last.tmp-" in last_line, result.stderr[-3000:]
    assert snapshot(root / "checkpoints") == before


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))  # bytes: smaller than any weights file


def test_disk_full_during_save_raises_and_keeps_earlier_checkpoints(tmp_path):
    before = checkpoints_after_first_half(tmp_path)
    result = run(job_command(tmp_path, "resume"), preexec_fn=_limit_file_size)
    assert "File too large" in result.stderr, result.stderr[-3000:]
    assert_refused_and_intact(result, tmp_path, before)


def _read_only_mounts_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount --bind / / 2>/dev/null || mount --bind /tmp /tmp"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not _read_only_mounts_work(), reason="needs `unshare -rm` (a private mount namespace)"
)
def test_read_only_checkpoint_folder_raises_and_keeps_earlier_checkpoints(tmp_path):
    before = checkpoints_after_first_half(tmp_path)
    folder = tmp_path / "checkpoints"
    # A private mount namespace makes the folder read-only for the job alone (root ignores
    # permission bits, so chmod would not do).
    script = (
        f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && '
        f'exec "{sys.executable}" "{JOB}" "{tmp_path}" resume'
    )
    result = run(["unshare", "-rm", "sh", "-c", script])
    assert "Read-only file system" in result.stderr, result.stderr[-3000:]
    assert_refused_and_intact(result, tmp_path, before)
