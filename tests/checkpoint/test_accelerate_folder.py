"""Accelerator.load_state reads a folder that real Hugging Face Accelerate's save_state wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer import Accelerator
from trainer.checkpoint.accelerate_folder import is_accelerate_folder
from trainer.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("accelerate_resume_job.py")


def _run(which: str, cwd: Path) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [sys.executable, str(JOB), which], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    pytest.importorskip("accelerate")
    folder = tmp_path_factory.mktemp("accelerate")
    return folder, _run("accelerate", folder)


def test_load_state_continues_an_accelerate_run_exactly(accelerate_run):
    folder, third_epoch = accelerate_run
    assert is_accelerate_folder(folder / "acc_state")
    # weights, AdamW moments, the scheduler and the RNG (shuffle order, dropout) all carried over
    assert _run("trainer", folder) == third_epoch


def test_a_users_own_manifest_beside_accelerates_files_keeps_it_an_accelerate_folder(
    accelerate_run, tmp_path
):
    # Any manifest.json made the folder count as a trainer checkpoint, which then failed to
    # verify; only a manifest trainer wrote does (has_trainer_manifest).
    folder, _ = accelerate_run
    state = tmp_path / "state"
    state.mkdir()
    for file in (folder / "acc_state").iterdir():
        (state / file.name).write_bytes(file.read_bytes())
    (state / "manifest.json").write_text(json.dumps({"dataset": "mine", "files": ["a.csv"]}))
    assert is_accelerate_folder(state)


def test_unread_files_are_named_in_a_warning(accelerate_run, tmp_path):
    folder, _ = accelerate_run
    state = tmp_path / "state"
    state.mkdir()
    for file in (folder / "acc_state").iterdir():
        (state / file.name).write_bytes(file.read_bytes())
    (state / "scaler.pt").write_bytes(b"")
    accelerator = Accelerator()
    model = accelerator.prepare(
        torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4)
        )
    )
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters()))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, 5))
    with pytest.warns(UserWarning, match=r"scaler\.pt not read"):
        accelerator.load_state(state)
    assert scheduler.last_epoch == 16
    assert int(optimizer.state_dict()["state"][0]["step"]) == 16


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_a_pickle_that_would_run_code_is_refused_and_not_run(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    marker = tmp_path / "ran"
    torch.save({"state": {}, "param_groups": [_Payload(str(marker))]}, state / "optimizer.bin")
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    torch.save(model.state_dict(), state / "pytorch_model.bin")

    with pytest.raises(CheckpointError, match="optimizer.bin: it cannot be read without running"):
        accelerator.load_state(state)
    assert not marker.exists()


def test_engine_subfolders_are_refused_with_what_to_do(tmp_path):
    state = tmp_path / "state"
    (state / "pytorch_model_fsdp_0").mkdir(parents=True)
    (state / "optimizer.bin").write_bytes(b"")
    accelerator = Accelerator()

    with pytest.raises(CheckpointError, match="accelerate merge-weights"):
        accelerator.load_state(state)


def _good_rng() -> dict:
    import random

    import numpy as np

    return {
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }


@pytest.mark.parametrize(
    ("rng", "match"),
    [
        ({"random_state": "junk"}, r"random_states_0\.pkl\['random_state'\].*random\.getstate"),
        (
            {"torch_manual_seed": torch.zeros(3, dtype=torch.uint8)},
            r"random_states_0\.pkl\['torch_manual_seed'\].*torch\.get_rng_state",
        ),
        ({"numpy_random_seed": (1, 2)}, r"random_states_0\.pkl\['numpy_random_seed'\].*numpy"),
        (
            {"torch_cuda_manual_seed": "junk"},
            r"random_states_0\.pkl\['torch_cuda_manual_seed'\]",
        ),
        ([1, 2], r"random_states_0\.pkl: expected the dict of RNG states"),
        ({"step": -3}, r"random_states_0\.pkl\['step'\].*accumulation_step"),
        ({"step": "4"}, r"random_states_0\.pkl\['step'\].*accumulation_step"),
    ],
)
def test_a_bad_rng_state_is_refused_before_anything_is_loaded(tmp_path, rng, match):
    from safetensors.torch import save_file

    state = tmp_path / "state"
    state.mkdir()
    save_file(torch.nn.Linear(2, 2).state_dict(), state / "model.safetensors")
    saved = torch.nn.Linear(2, 2)
    saved_optimizer = torch.optim.SGD(saved.parameters(), lr=0.5, momentum=0.9)
    saved(torch.ones(1, 2)).sum().backward()
    saved_optimizer.step()
    torch.save(saved_optimizer.state_dict(), state / "optimizer.bin")
    torch.save(
        {**_good_rng(), **rng} if isinstance(rng, dict) else rng, state / "random_states_0.pkl"
    )
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch_rng = torch.get_rng_state()

    with pytest.raises(CheckpointError, match=match):
        accelerator.load_state(state)

    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {}
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert torch.equal(torch.get_rng_state(), torch_rng)


def test_accelerates_accumulation_step_is_restored(tmp_path):
    # Accelerate saves its accumulation count beside the RNG states; resuming mid-window went on
    # with the count restarted (the parity scenario resume/mid_accumulation_window runs both).
    from safetensors.torch import save_file

    state = tmp_path / "state"
    state.mkdir()
    save_file(torch.nn.Linear(2, 2).state_dict(), state / "model.safetensors")
    torch.save({**_good_rng(), "step": 4}, state / "random_states_0.pkl")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.load_state(state)
    assert accelerator.gradient_state.step == 4
