"""AsyncCheckpointIO under FSDP2 with SHARDED state dicts (2 processes, torchrun, gloo on CPU):
every process writes its shards with DCP's ``async_save`` while training goes on, and the run keeps
the checkpoints, bookkeeping and final weights of a synchronous one, resumed or not; failures
are raised naming the checkpoint; a kill -9 in the middle of a background write leaves the
previous ``last`` (trainer/plugins/async_sharded.py, trainer/checkpoint/sharded_async.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from trainer.checkpoint import find_latest_checkpoint, read_checkpoint, verify_checkpoint
from trainer.checkpoint.atomic import is_temporary
from trainer.checkpoint.sharded import DCP_DIR, read_dcp_metadata, safe_storage_reader

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "distributed" / "async_checkpoint_fsdp_worker.py"
pytestmark = [pytest.mark.distributed, pytest.mark.slow]
NAMES = ["epoch=1-step=12", "epoch=1-step=15", "last"]  # top 2 by step, and `last` (step 16)


def torchrun(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The worker under torchrun, in its own session: on a timeout the workers go too."""
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", str(WORKER), str(root), *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_ok(root: Path, *args: str) -> None:
    result = torchrun(root, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def facts(root: Path, mode: str) -> list[dict[str, Any]]:
    return [json.loads((root / f"rank{r}-{mode}.json").read_text()) for r in range(2)]


def sharded_contents(folder: Path) -> dict[str, Any]:
    """Everything a sharded checkpoint holds, read in one process without running code: the
    DCP tensors (model and optimizer, full), and the JSON state."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    manifest = verify_checkpoint(folder)
    assert manifest["world_size"] == 2 and "model.safetensors" not in manifest["files"]
    assert f"{DCP_DIR}/.metadata" in manifest["files"]
    read_dcp_metadata(folder / DCP_DIR / ".metadata")  # the allow-list unpickler admits it
    with warnings.catch_warnings():  # "no process group: loading in one process" is the point
        warnings.simplefilter("ignore", UserWarning)
        tensors = _load_state_dict_from_keys(storage_reader=safe_storage_reader(folder / DCP_DIR))
    return {"tensors": tensors, "state": read_checkpoint(folder)}


def inside_run(value: Any, root: str) -> Any:
    """``value`` with the run's folder in every string (keys too) written as ``<run>``."""
    if isinstance(value, str):
        return value.replace(root, "<run>")
    if isinstance(value, dict):
        return {inside_run(k, root): inside_run(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(inside_run(item, root) for item in value)
    return value


def assert_same(a: Any, b: Any, where: str) -> None:
    """Equal values, tensors equal element for element (same dtype and shape)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}.{i}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert a == b, (where, a, b)


def assert_final_weights(root: Path, mode: str, reference: dict[str, torch.Tensor]) -> None:
    final = load_file(str(root / f"final-{mode}.safetensors"))
    assert final.keys() == reference.keys()
    for key, tensor in reference.items():
        assert torch.equal(final[key], tensor), (root, mode, key)


def real_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not is_temporary(p.name))


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory) -> Path:
    """The uninterrupted job with synchronous sharded saves."""
    root = tmp_path_factory.mktemp("sync")
    run_ok(root, "full", "--sync")
    return root


def test_async_sharded_checkpoints_equal_synchronous_ones_tensor_for_tensor(synchronous, tmp_path):
    async_root = tmp_path / "async"
    run_ok(async_root, "full", "--slow")  # each background write starts 0.3 s late
    reference = load_file(str(synchronous / "final-full.safetensors"))
    assert_final_weights(async_root, "full", reference)
    got, expected = facts(async_root, "full"), facts(synchronous, "full")
    for rank in range(2):
        # fit returned on every process only once every checkpoint, `last` included, was in
        # place: no temporary folder was left at that moment, on either process.
        assert got[rank]["entries"] == expected[rank]["entries"] == NAMES, got[rank]
        for key in ("best_model_path", "last_model_path", "global_step"):
            assert got[rank][key] == expected[rank][key], (rank, key)
        # Training went on while the shards were written, and the next save waited, reported.
        assert any(end > begun for begun, end in got[rank]["spans"]), got[rank]["spans"]
        assert got[rank]["save_count"] == 6 and got[rank]["total_wait_s"] > 0, got[rank]
    folder, reference_folder = async_root / "checkpoints", synchronous / "checkpoints"
    assert real_entries(folder) == real_entries(reference_folder) == NAMES
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)]
    for name in NAMES:  # each holds the weights of its own step, not later ones
        got_contents = inside_run(sharded_contents(folder / name), str(async_root))
        expected_contents = inside_run(sharded_contents(reference_folder / name), str(synchronous))
        assert_same(got_contents, expected_contents, name)
    assert read_checkpoint(folder / "last")["global_step"] == 16


def test_resume_from_an_async_sharded_checkpoint_gives_the_uninterrupted_weights(
    synchronous, tmp_path
):
    run_ok(tmp_path, "first-half")  # saves at steps 3 and 6 in the background, stops at 7
    assert read_checkpoint(tmp_path / "checkpoints" / "last")["global_step"] == 7
    run_ok(tmp_path, "resume")
    assert_final_weights(tmp_path, "resume", load_file(str(synchronous / "final-full.safetensors")))
    got, expected = facts(tmp_path, "resume"), facts(synchronous, "full")
    for rank in range(2):
        assert got[rank]["entries"] == NAMES
        assert got[rank]["best_model_path"] == expected[rank]["best_model_path"]


@pytest.mark.parametrize("mode", ["blocked", "disk-full"])
def test_a_background_failure_is_raised_on_every_process_naming_the_checkpoint(tmp_path, mode):
    # "blocked": a file is where the folder must go: refused at the save call, on every process,
    # before anything is written (as a synchronous save); "disk-full": process 0 alone cannot
    # write its shard file in the background (RLIMIT_FSIZE).
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    result = torchrun(tmp_path, mode)
    assert result.returncode != 0, result.stderr[-3000:]
    name, cause = (
        (str(tmp_path / "blocker" / "ck"), "File exists")
        if mode == "blocked"
        else (str(tmp_path / "checkpoints" / "full-disk"), "File too large")
    )
    for rank in range(2):
        error = (tmp_path / f"error-rank{rank}.txt").read_text()
        where = "cannot create checkpoint" if mode == "blocked" else "background save of checkpoint"
        assert where in error and name in error, (rank, error)
        assert cause in error, (rank, error)
    folder = tmp_path / "checkpoints"
    for entry in real_entries(folder):  # earlier checkpoints are intact
        verify_checkpoint(folder / entry)
    assert read_checkpoint(folder / "last")["global_step"] == (3 if mode == "blocked" else 6)


def test_sigterm_completes_the_saves_in_flight_before_the_process_exits(synchronous, tmp_path):
    result = torchrun(tmp_path, "preempt", "--slow")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "received SIGTERM; saved a checkpoint at step 10" in result.stderr
    folder = tmp_path / "checkpoints"
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)]
    assert real_entries(folder) == [
        "epoch=0-step=6", "epoch=1-step=9", "last", "preempted-epoch=1-step=10"
    ]  # fmt: skip
    for entry in real_entries(folder):
        verify_checkpoint(folder / entry)
    assert read_checkpoint(folder / "last")["global_step"] == 9  # its swap waited for step 9
    run_ok(tmp_path, "resume")
    assert_final_weights(tmp_path, "resume", load_file(str(synchronous / "final-full.safetensors")))


# (operation, its n-th occurrence off the training thread from the save at step 9 on, the step
# resume starts from): a DCP shard's fsync (DCP's upload thread); the move of the shards into the
# checkpoint folder, and its rename into place (process 0's commit on the writer thread); the
# move of the shards of the `last` copy (step 9 is complete under its name, `last` is not).
KILLS = [("fsync", 1, 6), ("rename", 2, 6), ("rename", 3, 6), ("rename", 5, 9)]


@pytest.mark.parametrize(("op", "n", "start"), KILLS)
def test_kill_9_during_a_background_write_leaves_the_previous_last(
    synchronous, tmp_path, op, n, start
):
    killed = torchrun(tmp_path, "kill", op, str(n))
    where = f"kill -9 at {op} #{n}"
    assert killed.returncode != 0, (where, killed.stderr[-3000:])
    assert (tmp_path / "killed-on-thread.txt").read_text() != "MainThread", where
    folder = tmp_path / "checkpoints"
    for entry in real_entries(folder):  # never a complete-looking wrong checkpoint
        verify_checkpoint(folder / entry)
    assert any(is_temporary(p.name) for p in folder.iterdir()), where
    assert read_checkpoint(folder / "last")["global_step"] == 6, where
    latest = find_latest_checkpoint(folder)
    assert latest is not None and read_checkpoint(latest)["global_step"] == start, where

    run_ok(tmp_path, "resume")
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)], where
    reference = load_file(str(synchronous / "final-full.safetensors"))
    assert_final_weights(tmp_path, "resume", reference)
