"""The test launcher itself: a job that hangs is killed whole, torchrun's workers included."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, torchrun

pytestmark = pytest.mark.distributed


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def test_a_timed_out_torchrun_job_leaves_no_worker_running(tmp_path: Path):
    # torchrun starts each worker in a session of its own: killing torchrun's session alone left
    # them running (a DeepSpeed job hung on CI kept its workers alive for the rest of the run).
    with pytest.raises(subprocess.TimeoutExpired):
        torchrun(str(ROOT / "tests/distributed/sleeping_worker.py"), str(tmp_path), timeout=20)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("worker*.pid"))]
    assert len(pids) == 2, "the workers did not start within the timeout"
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), f"workers still running: {pids} ({os.getpid()})"
