"""Fault matrix, part 2: preemption signals and failing ranks (issue #13).

- SIGTERM / SIGUSR1 mid-epoch, on 1 process and on 2 (torchrun, gloo): the job saves and exits
  with status 0, and ``fit(ckpt_path="last")`` ends with the uninterrupted run's weights.
- On 2 processes, rank 1 raises, calls ``os._exit(1)``, or is SIGKILLed while rank 0 waits in a
  collective: the job ends within 60 s with a message naming the rank.
- The launcher killed with SIGKILL: the ranks save a preemption checkpoint and exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "faults" / "distributed_job.py"

pytestmark = pytest.mark.slow


def run_job(root: Path, mode: str, processes: int, timeout: float = 300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        if processes == 2
        else [sys.executable]
    )
    return subprocess.run(
        [*launcher, str(JOB), str(root), mode],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, dict[str, torch.Tensor]]:
    """The final weights of the uninterrupted run, on 1 and on 2 processes."""
    weights = {}
    for processes in (1, 2):
        root = tmp_path_factory.mktemp(f"full{processes}")
        result = run_job(root, "full", processes)
        assert result.returncode == 0, result.stderr[-3000:]
        weights[processes] = load_file(str(root / "final-full.safetensors"))
        for name, tensor in weights[processes].items():  # NaN would never compare equal
            assert torch.isfinite(tensor).all(), f"{name} diverged on {processes} process(es)"
    return weights


# SIGUSR1 on 2 processes, with its resume to the uninterrupted weights, is the SLURM recipe's
# test (tests/faults/test_scheduler_signals.py): not run twice, to keep CI inside its budget.
@pytest.mark.parametrize(
    ("signal_name", "processes"), [("SIGTERM", 1), ("SIGTERM", 2), ("SIGUSR1", 1)]
)
def test_signal_mid_epoch_saves_exits_zero_and_resumes_exactly(
    tmp_path, uninterrupted, processes, signal_name
):
    stopped = run_job(tmp_path, signal_name, processes)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert f"received {signal_name}" in stopped.stderr
    assert not (tmp_path / f"final-{signal_name}.safetensors").exists()  # it did stop early
    saved = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("preempted")]
    assert len(saved) == 1, saved  # at step 7, or the next step where the ranks compare flags

    resumed = run_job(tmp_path, "resume", processes)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_file(str(tmp_path / "final-resume.safetensors"))
    for name, tensor in uninterrupted[processes].items():
        assert torch.equal(final[name], tensor), name


def test_a_signal_after_the_ranks_last_compared_flags_still_saves_and_exits_zero(tmp_path):
    """On 2 processes the ranks compare flags every 10 steps; a SIGTERM after the last
    comparison (here in the last epoch's end, step 18) was dropped and the job ran on."""
    stopped = run_job(tmp_path, "SIGTERM-late", processes=2)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "received SIGTERM" in stopped.stderr
    assert not (tmp_path / "final-SIGTERM-late.safetensors").exists()  # the process exited
    saved = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("preempted")]
    assert saved == ["preempted-epoch=3-step=18"], saved


def test_a_signal_to_one_rank_during_test_finishes_the_epoch_and_every_rank_exits_zero(tmp_path):
    """SIGTERM during test() killed the rank (status 143: no handler outside fit), failing the
    job; now the ranks agree when the epoch ends, and every one exits 0 after its results."""
    stopped = run_job(tmp_path, "SIGTERM-test", processes=2)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "received SIGTERM during test; the test epoch is complete" in stopped.stderr
    assert "test_loss" in stopped.stdout, stopped.stdout[-3000:]  # rank 0's results table
    assert not (tmp_path / "final-SIGTERM-test.safetensors").exists()  # the script went no further


def _is_running(pid: int) -> bool:
    """Whether ``pid`` runs (an orphan that ended may stay a zombie until init reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_ranks_whose_launcher_is_killed_save_and_stop(tmp_path):
    """kill -9 of torchrun's agent (`trainer launch`, torchrun) left both ranks training on,
    unwatched, writing checkpoints a resubmitted job would read; now each notices within a
    second, saves a preemption checkpoint and exits."""
    from trainer.accelerator.machine_watch import training_processes

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(JOB), str(tmp_path), "orphan"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    checkpoints = tmp_path / "checkpoints"
    deadline = time.monotonic() + 180
    while not (checkpoints.is_dir() and any(checkpoints.iterdir())):  # training is under way
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.1)
    ranks = training_processes(launcher.pid)
    assert len(ranks) == 2, ranks
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 60
    while any(map(_is_running, ranks)) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in ranks if _is_running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the ranks trained on after their launcher was killed"
    saved = [p.name for p in checkpoints.iterdir() if p.name.startswith("preempted")]
    assert len(saved) == 1, sorted(p.name for p in checkpoints.iterdir())


@pytest.mark.parametrize("how", ["raise", "exit", "sigkill"])
def test_a_failing_rank_ends_the_job_promptly_and_is_named(tmp_path, how):
    start = time.monotonic()
    result = run_job(tmp_path, how, processes=2, timeout=120)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end after rank 1 failed ({how})"
    assert "rank      : 1" in output or "rank: 1" in output, output[-3000:]
    if how == "raise":
        assert "injected failure on rank 1 at step 3" in output


def test_an_interrupted_rank_reports_its_keyboard_interrupt(tmp_path):
    """Rank 1's KeyboardInterrupt was replaced by the error of writing torchrun's error file
    (here in a folder that does not exist), and its message read "KeyboardInterrupt: ."."""
    result = run_job(tmp_path, "interrupt", processes=2, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "trainer: rank 1 of 2 was interrupted during fit: KeyboardInterrupt. " in output, output[
        -3000:
    ]
    assert "FileNotFoundError" not in output, output[-3000:]
