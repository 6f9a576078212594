"""Shared test helpers: tiny real data and a small TrainModule."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed
from torch.utils.data import DataLoader, TensorDataset

import trainer

# DeepSpeed on the CPU accelerator compiles a comm op on first use (a minute or more on 2 cores)
# under a lock file in this folder. Every test process uses the one folder, and the op is built
# once before any test starts (pytest_sessionstart): a test that timed out while compiling would
# leave the lock behind, and every later DeepSpeed test would wait on it forever (a CI run hung).
TORCH_EXTENSIONS_DIR = os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions")
)
_STALE_LOCK_SECONDS = 15 * 60  # far longer than a build takes on 2 busy cores


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build DeepSpeed's CPU comm op once, in the controlling process, before the tests start."""
    if hasattr(session.config, "workerinput") or importlib.util.find_spec("deepspeed") is None:
        return  # an xdist worker (the controller built it), or no DeepSpeed tests to run
    lock = Path(TORCH_EXTENSIONS_DIR) / "deepspeed_shm_comm" / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_SECONDS:
        lock.unlink()  # left by a build that was killed; torch would wait on it forever
    build = (
        "from deepspeed.accelerator import get_accelerator\n"
        "builder = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
        "builder is None or builder.load(verbose=False)\n"
    )
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    try:
        subprocess.run(
            [sys.executable, "-c", build], env=env, capture_output=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        pass  # the DeepSpeed tests then fail on their own timeouts, naming themselves


def load_module_from_file(path: Path, name: str | None = None) -> ModuleType:
    """Import the Python file ``path`` (a script or example, not on the path) as a module."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_loader(
    n: int = 32, batch_size: int = 4, *, seed: int = 0, shuffle: bool = False
) -> DataLoader:
    """A regression problem y = x @ w, ``n`` samples of 4 features."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


class LinearModule(trainer.TrainModule):
    """Linear regression with SGD; logs train/loss and val/loss."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/loss", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def quiet_trainer(tmp_path, **kwargs) -> trainer.Trainer:
    """A Trainer with no bar, summary or logger unless asked, writing under ``tmp_path``."""
    options = dict(
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return trainer.Trainer(**options)


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """A 1-process gloo group (a file store under ``tmp_path``), ended after the test."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture
def loader() -> DataLoader:
    return make_loader()


@pytest.fixture(autouse=True)
def _not_inside_a_scheduler_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that send SIGUSR1 to themselves must not requeue a real SLURM job running the suite."""
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
