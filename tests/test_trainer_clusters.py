"""A one-process job under a cluster scheduler keeps the cluster environment plugin it was given.

SLURM is simulated as in tests/faults/test_scheduler_signals.py: the job's variables
(``SLURM_JOB_ID``, one task: ``SLURM_NTASKS=1``, ``SLURM_PROCID=0``) and a stand-in ``scontrol``
first on ``PATH`` that records its arguments. The training script runs in its own process and
sends itself SIGUSR1 in step 3 (what ``#SBATCH --signal=USR1@90`` delivers): it must save a
checkpoint once that step is done and exit with status 0, requeueing the job unless
``SLURMEnvironment(auto_requeue=False)`` was passed — on the single-device strategy too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import Trainer
from trainer.strategies import SingleDeviceStrategy, SLURMEnvironment

ROOT = Path(__file__).resolve().parents[1]
JOB_ID = "4242"

SCONTROL = """#!/bin/bash
echo "$*" >> "$SCONTROL_LOG"
"""

JOB = """
import os, signal, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
import trainer
from trainer.strategies import SLURMEnvironment


class Module(trainer.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            os.kill(os.getpid(), signal.SIGUSR1)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


x = torch.randn(32, 4)
plugins = [SLURMEnvironment(auto_requeue=False)] if sys.argv[2] == "off" else []
fit = trainer.Trainer(
    max_epochs=2, default_root_dir=sys.argv[1], plugins=plugins, logger=False,
    enable_progress_bar=False, enable_model_summary=False,
)
assert type(fit.strategy).__name__ == "SingleDeviceStrategy", fit.strategy
fit.fit(Module(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
raise SystemExit("fit returned: the signal was not acted on")
"""


def _slurm_job(tmp_path: Path, requeue: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the job as one SLURM task; return its result and what scontrol was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "job.py").write_text(JOB)
    log = tmp_path / "scontrol.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TRAINER_STRATEGY"):
        env.pop(name, None)  # SLURM's variables alone say which process this is
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        SCONTROL_LOG=str(log),
        SLURM_JOB_ID=JOB_ID,
        SLURM_JOB_NAME="train",
        SLURM_NTASKS="1",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        SLURM_NODELIST="localhost",
    )
    command = [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "run"), requeue]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    return result, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("requeue", "expected"), [("off", []), ("default", [f"requeue {JOB_ID}"])])
def test_one_task_slurm_job_keeps_its_environment_plugin(
    tmp_path: Path, requeue: str, expected: list[str]
) -> None:
    result, asked = _slurm_job(tmp_path, requeue)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer: received SIGUSR1; saved a checkpoint at step 4" in result.stderr
    assert list((tmp_path / "run" / "checkpoints").glob("preempted-epoch=0-step=4*"))
    assert asked == expected


def test_the_single_device_strategy_holds_the_plugin_given() -> None:
    environment = SLURMEnvironment(auto_requeue=False)
    fit = Trainer(plugins=[environment], accelerator="cpu", logger=False)
    assert isinstance(fit.strategy, SingleDeviceStrategy)
    assert fit.strategy.environment is environment
    assert SingleDeviceStrategy("cpu").environment.world_size == 1  # read from the variables
