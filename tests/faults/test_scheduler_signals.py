"""Signals as schedulers send them, SLURM's requeue, elastic restarts, a failing rank (issue #18,
items 3-5), on 2 processes (gloo on CPU).

The batch scripts are the recipes of docs/clusters.md, read from the page (with 2 processes for
8 and the test job for ``train.py``), run by bash with stand-ins on PATH: ``srun`` starts the
tasks with SLURM's variables and passes signals on to them, ``scontrol`` records its arguments,
``trainer`` is ``python -m trainer.cli``. Every run calls ``fit(ckpt_path="last")``.

- SIGTERM to ``trainer launch`` (one launcher per machine under srun), SIGUSR1 to a batch shell
  that passes it on, SIGUSR1 to every task: one checkpoint, status 0; SIGUSR1 requeues the job
  (``scontrol requeue``), SIGTERM does not; the requeued run resumes to the uninterrupted weights.
- ``trainer launch --max_restarts 1``: a process SIGKILLed mid-run restarts, resumes from the
  newest checkpoint, and the job ends with the uninterrupted weights.
- A rank that raises, with ``OnExceptionCheckpoint``, ends the job within 60 s, named.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from trainer.strategies.environment import SLURMEnvironment
from trainer.trainer.preemption import requeue_slurm_job

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "distributed" / "cluster_job.py"
JOB_ID = "4242"

SRUN = f"""#!{sys.executable}
# srun as far as these tests need it: SLURM_NTASKS tasks on this host, signals passed on.
import os, signal, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
tasks = [
    subprocess.Popen(args, env=dict(os.environ, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NODEID="0"))
    for r in range(int(os.environ["SLURM_NTASKS"]))
]
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, lambda signum, frame: [t.send_signal(signum) for t in tasks])
sys.exit(max(t.wait() for t in tasks))
"""
SCONTROL = """#!/bin/bash
echo "$*" >> "$SCONTROL_LOG"
if [ "$1" = show ] && [ "$2" = hostnames ]; then echo "${3%%,*}"; fi
"""
TRAINER = f"""#!/bin/bash
exec {sys.executable} -m trainer.cli "$@"
"""


def recipe(name: str) -> str:
    """The code block under ``<!-- recipe: NAME -->`` in docs/clusters.md."""
    page = (ROOT / "docs" / "clusters.md").read_text()
    found = re.search(rf"<!-- recipe: {name} -->\n```\w*\n(.*?)\n```", page, flags=re.DOTALL)
    assert found, f"docs/clusters.md lost its {name!r} recipe"
    return found.group(1) + "\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This checkout, the stand-ins first on PATH, SLURM's variables for a 1-node batch job."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.is_dir():
        bin_dir.mkdir()
        for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("trainer", TRAINER)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SCONTROL_LOG=str(tmp_path / "scontrol.log"),
        XDG_CACHE_HOME=str(tmp_path / "cache"), SLURM_JOB_ID=JOB_ID, SLURM_JOB_NAME="train",
        SLURM_NNODES="1", SLURM_NODELIST="localhost", SLURM_JOB_NODELIST="localhost",
        MASTER_PORT=str(_free_port()),
    )  # fmt: skip
    env.update(extra)
    return env


def run(
    command: list[str], env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


def batch(tmp_path: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    return run(["bash", str(path)], env)


def launch(root: Path, mode: str, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trainer.cli", "launch", "--cpu", *flags, str(JOB)]
    return run([*command, str(root), mode], environment(root))


def preempted(root: Path) -> list[str]:
    return sorted(
        p.name for p in (root / "checkpoints").iterdir() if p.name.startswith("preempted")
    )


def requeues(root: Path) -> list[str]:
    log = root / "scontrol.log"
    return (
        [line for line in log.read_text().splitlines() if "requeue" in line] if log.exists() else []
    )


def assert_same_weights(path: Path, expected: dict[str, torch.Tensor]) -> None:
    final = load_file(str(path))
    assert sorted(final) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(final[name], tensor), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of the job run to its end on 2 processes."""
    root = tmp_path_factory.mktemp("full")
    result = launch(root, "full", "--num_processes", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(str(root / "final-full.safetensors"))


@pytest.mark.slow
@pytest.mark.distributed
def test_slurm_srun_every_task_gets_usr1_saves_requeues_and_resumes(tmp_path, uninterrupted):
    script = recipe("slurm-srun").replace(
        "python train.py", f"{sys.executable} {JOB} {tmp_path} signal-self"
    )
    first = batch(
        tmp_path, script, environment(tmp_path, SLURM_NTASKS="2", CLUSTER_SIGNAL="SIGUSR1")
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "received SIGUSR1" in first.stderr and f"requeued SLURM job {JOB_ID}" in first.stderr
    assert preempted(tmp_path) == ["preempted-epoch=0-step=10"]  # every task: the step of agreement
    assert requeues(tmp_path) == [f"requeue {JOB_ID}"]
    rerun = environment(tmp_path, SLURM_NTASKS="2", SLURM_RESTART_COUNT="1")
    second = batch(tmp_path, script, rerun)  # what SLURM runs after the requeue
    assert second.returncode == 0, second.stderr[-3000:]
    assert_same_weights(tmp_path / "final-signal-self.safetensors", uninterrupted)


@pytest.mark.slow
@pytest.mark.distributed
def test_slurm_launcher_sigterm_saves_without_requeue(tmp_path):
    script = recipe("slurm-launcher").replace("GPUS_PER_NODE=8", "GPUS_PER_NODE=2")
    script = script.replace("train.py", f"{JOB} {tmp_path} signal-launcher")
    result = batch(
        tmp_path, script, environment(tmp_path, SLURM_NTASKS="1", CLUSTER_SIGNAL="SIGTERM")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "trainer launch: received SIGTERM; passed it on to 2 training process(es)" in result.stderr
    )
    assert len(preempted(tmp_path)) == 1 and requeues(tmp_path) == []


@pytest.mark.slow
@pytest.mark.distributed
def test_batch_shell_passes_usr1_on_saves_and_requeues(tmp_path):
    script = recipe("slurm-batch-shell").replace("--num_processes 8", "--num_processes 2")
    script = script.replace("train.py", f"{JOB} {tmp_path} signal-shell")
    result = batch(tmp_path, script, environment(tmp_path, CLUSTER_SIGNAL="SIGUSR1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer launch: received SIGUSR1" in result.stderr
    assert len(preempted(tmp_path)) == 1 and requeues(tmp_path) == [f"requeue {JOB_ID}"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_killed_process_restarts_and_the_job_ends_as_if_uninterrupted(tmp_path, uninterrupted):
    assert "--max_restarts 3" in recipe("restarts")
    result = launch(tmp_path, "kill-once", "--num_processes", "2", "--max_restarts", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer: rank 0 of 2 failed during fit" in result.stderr  # the first attempt failed
    assert_same_weights(tmp_path / "final-kill-once.safetensors", uninterrupted)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_with_on_exception_checkpoint_ends_within_60_s_named(tmp_path):
    result = launch(tmp_path, "raise", "--num_processes", "2")
    elapsed = time.time() - float((tmp_path / "failed_at").read_text())  # since rank 1 raised
    assert result.returncode == 1 and elapsed < 60, f"{elapsed:.0f} s: {result.stderr[-3000:]}"
    root_cause = result.stderr.split("Root Cause")[-1]
    assert "rank      : 1 (local_rank: 1)" in root_cause, result.stderr[-3000:]
    assert "RuntimeError: injected failure on rank 1 at step 5" in root_cause
    assert "trainer: rank 1 of 2 failed during fit: RuntimeError: injected failure" in result.stderr


def test_requeue_runs_scontrol_on_rank_0_for_sigusr1_only(tmp_path, monkeypatch, capsys):
    env = environment(tmp_path)
    for name in ("PATH", "SCONTROL_LOG", "SLURM_JOB_ID", "SLURM_JOB_NAME"):
        monkeypatch.setenv(name, env[name])
    usr1, term = int(signal.SIGUSR1), int(signal.SIGTERM)

    def fit(environment=None, rank0=True):
        return SimpleNamespace(
            strategy=SimpleNamespace(environment=environment), is_global_zero=rank0
        )

    assert requeue_slurm_job(fit(), usr1) == JOB_ID
    assert requeue_slurm_job(fit(), term) is None  # scancel / time limit: no requeue
    assert requeue_slurm_job(fit(rank0=False), usr1) is None
    off = SLURMEnvironment(auto_requeue=False)
    assert requeue_slurm_job(fit(off), usr1) is None
    assert requeue_slurm_job(fit(SLURMEnvironment(requeue_signal=term)), term) == JOB_ID
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert requeue_slurm_job(fit(), usr1) == "5_3"
    assert requeues(tmp_path) == [f"requeue {JOB_ID}"] * 2 + ["requeue 5_3"]
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    assert requeue_slurm_job(fit(), usr1) is None
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/bash\necho 'denied' >&2\nexit 1\n")
    assert requeue_slurm_job(fit(), usr1) is None
    assert (
        "scontrol requeue 5_3 exited with 1: denied; the job was not requeued"
        in capsys.readouterr().err
    )
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    assert requeue_slurm_job(fit(), usr1) is None  # not a SLURM job
