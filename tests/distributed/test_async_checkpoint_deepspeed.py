"""AsyncCheckpointIO under DeepSpeed (2 processes, torchrun, gloo on CPU): ``engine.save_checkpoint``
runs at the step boundary with a checkpoint engine that copies each state dict to host memory,
DeepSpeed's own checkpoint engine writes the copies on the writer thread while training goes on,
and process 0 commits. The run keeps the checkpoints, bookkeeping and final weights of a
synchronous one, resumed or not; failures are raised on every process naming the checkpoint; a
kill -9 in the middle of a background write leaves only temporaries and the previous ``last``
(trainer/plugins/async_engine.py, trainer/strategies/deepspeed_checkpoint.py).

One launch ("main") runs every fit that ends normally or with a caught error; each kill -9 needs
its own launch and a resume.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.launch import ROOT, job_env, output_tail, torchrun
from trainer.checkpoint import find_latest_checkpoint, read_checkpoint, verify_checkpoint
from trainer.checkpoint.atomic import is_temporary

WORKER = ROOT / "tests" / "distributed" / "async_checkpoint_deepspeed_worker.py"
NAMES = ["epoch=1-step=12", "epoch=1-step=15", "last"]  # top 2 by step, and `last` (step 16)
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (pip install 'trainer[deepspeed]')",
    ),
]


def run(root: Path, *args: str) -> Any:
    env = job_env(DS_ACCELERATOR="cpu")
    env.setdefault(  # DeepSpeed's comm op, built once (see test_deepspeed.py)
        "TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    )
    return torchrun(WORKER, str(root), *args, timeout=300, env=env)


def facts(root: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads((root / name / f"rank{r}.json").read_text()) for r in range(2)]


def real_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not is_temporary(p.name))


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if is_temporary(p.name))


def final_weights(root: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(root / name / "final.safetensors"))


def assert_same(a: Any, b: Any, where: str) -> None:
    """Equal values: tensors element for element (dtype, shape, requires_grad), objects by their
    attributes (DeepSpeed's loss scaler)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b) and a.requires_grad == b.requires_grad, where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}.{i}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), where
    elif hasattr(a, "__dict__") and not dataclasses.is_dataclass(a):
        assert type(a) is type(b), where
        assert_same(vars(a), vars(b), f"{where}.{type(a).__name__}")
    else:
        assert a == b, (where, a, b)


def inside_run(value: Any, root: str) -> Any:
    """``value`` with the run's folder in every string (keys too) written as ``<run>``."""
    if isinstance(value, str):
        return value.replace(root, "<run>")
    if isinstance(value, dict):
        return {inside_run(k, root): inside_run(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(inside_run(item, root) for item in value)
    return value


def contents(folder: Path, run_root: Path, numel: int) -> dict[str, Any]:
    """Everything a DeepSpeed checkpoint holds: the state (JSON and tensors) and each of
    DeepSpeed's files, read without running code; verified against its manifest first.

    ZeRO-3's fp32 partitions end with padding that DeepSpeed never initializes (the model's
    ``numel`` parameters split in two): it is left out, since it differs from run to run.
    """
    from trainer.strategies.deepspeed_checkpoint import _load_engine_file

    manifest = verify_checkpoint(folder)
    found: dict[str, Any] = {"files": sorted(manifest["files"]), "world": manifest["world_size"]}
    found["state"] = inside_run(read_checkpoint(folder), str(run_root))
    for name in manifest["files"]:
        if name.endswith(".pt"):
            found[name] = _load_engine_file(folder / name)
        rank = re.search(r"zero_pp_rank_(\d)_mp_rank_00_optim_states", name)
        groups = found.get(name, {}).get("optimizer_state_dict", {}).get("fp32_flat_groups")
        if rank is not None and groups is not None:
            size = -(-numel // 2)
            real = max(0, min(size, numel - int(rank.group(1)) * size))
            groups[:] = [group[:real] for group in groups]
    return found


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> Path:
    """Synchronous and background runs of ZeRO-2 and ZeRO-3, a resume, and two failures."""
    root = tmp_path_factory.mktemp("ds_async")
    (root / "blocker").write_text("a file where a folder is expected")
    result = run(root, "main")
    assert result.returncode == 0, output_tail(result)
    return root


@pytest.mark.parametrize("stage", [2, 3])
def test_background_deepspeed_checkpoints_equal_synchronous_ones_tensor_for_tensor(main_run, stage):
    sync, background = f"zero{stage}-sync", f"zero{stage}-async"
    expected, got = facts(main_run, sync), facts(main_run, background)
    for rank in range(2):
        # fit returned on every process only once every checkpoint, `last` included, was in
        # place: no temporary folder at that moment.
        assert got[rank]["entries"] == expected[rank]["entries"] == NAMES, got[rank]
        for key in ("best_model_path", "last_model_path", "global_step"):
            assert got[rank][key] == expected[rank][key], (rank, key)
        # Training went on while DeepSpeed's files were written; the next save waited for them.
        assert any(end > begun for begun, end in got[rank]["spans"]), got[rank]["spans"]
        # 6 by ModelCheckpoint, 1 weights-only (WeightsOnlyAt)
        assert got[rank]["save_count"] == 7 and got[rank]["total_wait_s"] > 0, got[rank]
    folder, reference = main_run / background / "checkpoints", main_run / sync / "checkpoints"
    assert real_entries(folder) == real_entries(reference) == NAMES
    assert not temporaries(folder)
    expected_weights, got_weights = (
        final_weights(main_run, sync),
        final_weights(main_run, background),
    )
    assert_same(got_weights, expected_weights, "final weights")
    numel = sum(tensor.numel() for tensor in expected_weights.values())
    for name in NAMES:  # each holds its own step's state, written by DeepSpeed itself
        got_contents = contents(folder / name, main_run / background, numel)
        assert any(
            f.startswith("deepspeed/checkpoint/zero_pp_rank_1") for f in got_contents["files"]
        )
        assert_same(got_contents, contents(reference / name, main_run / sync, numel), name)
    assert read_checkpoint(folder / "last")["global_step"] == 16


@pytest.mark.parametrize("stage", [2, 3])
def test_a_weights_only_checkpoint_holds_the_gathered_weights_of_its_step(main_run, stage):
    folder = main_run / f"zero{stage}-weights-async"
    manifest = verify_checkpoint(folder)
    assert "model.safetensors" in manifest["files"], manifest["files"]
    assert not any(name.startswith("deepspeed/") for name in manifest["files"])
    got = read_checkpoint(folder)
    expected = load_file(str(folder) + ".safetensors")  # taken right after the save (step 4)
    assert_same(got["state_dict"], expected, "weights")
    assert got["global_step"] == 4
    synchronous = read_checkpoint(main_run / f"zero{stage}-weights-sync")
    assert_same(got["state_dict"], synchronous["state_dict"], "synchronous weights")


def test_resume_from_a_background_deepspeed_checkpoint_gives_the_uninterrupted_weights(main_run):
    # Stopped after step 7 (background saves at steps 3 and 6, `last` at 7), then resumed.
    assert_same(
        final_weights(main_run, "zero2-resume"), final_weights(main_run, "zero2-sync"), "resumed"
    )
    got, expected = facts(main_run, "zero2-resume"), facts(main_run, "zero2-sync")
    for rank in range(2):
        assert got[rank]["entries"] == NAMES
        assert got[rank]["best_model_path"] == expected[rank]["best_model_path"]


def test_a_folder_that_cannot_be_made_is_refused_on_every_process_at_the_save(main_run):
    # ROOT/blocker is a file: no process may start writing (and none waits for the others).
    for rank, fact in enumerate(facts(main_run, "zero2-blocked")):
        error = fact.get("error", "")
        assert str(main_run / "blocker" / "ck") in error, (rank, fact)
    folder = main_run / "zero2-blocked" / "checkpoints"
    for entry in real_entries(folder):  # earlier checkpoints are intact
        verify_checkpoint(folder / entry)
    assert not temporaries(folder)
    assert read_checkpoint(folder / "last")["global_step"] == 3


def test_a_background_failure_is_raised_on_every_process_naming_the_checkpoint(main_run):
    # Process 0 cannot write its DeepSpeed file (RLIMIT_FSIZE: a full disk); process 1 can.
    name = str(main_run / "zero2-disk" / "checkpoints" / "full-disk")
    for rank, fact in enumerate(facts(main_run, "zero2-disk")):
        error = fact.get("error", "")
        assert "background save of checkpoint" in error and name in error, (rank, fact)
        # torch's zip writer loses the errno ("unexpected pos"): the file is named instead.
        assert "DeepSpeed's file checkpoint/mp_rank_00_model_states.pt" in error, (rank, error)
        assert rank == 0 or "process 0" in error, error
    folder = main_run / "zero2-disk" / "checkpoints"
    assert not temporaries(folder)  # process 0 removed the staging folder
    for entry in real_entries(folder):
        verify_checkpoint(folder / entry)
    assert "full-disk" not in real_entries(folder)
    assert read_checkpoint(folder / "last")["global_step"] == 6


# (operation off the training thread, its n-th occurrence from the save at step 9 on): the fsync
# of process 0's first DeepSpeed file (written by DeepSpeed's checkpoint engine on the writer
# thread); the rename of the complete checkpoint into place (process 0's commit).
KILLS = [("fsync", 1), ("rename", 2)]


@pytest.mark.parametrize(("op", "n"), KILLS)
def test_kill_9_during_a_background_write_leaves_the_previous_last(main_run, tmp_path, op, n):
    killed = run(tmp_path, "kill", op, str(n))
    where = f"kill -9 at {op} #{n}"
    assert killed.returncode != 0, (where, output_tail(killed))
    assert (tmp_path / "killed-on-thread.txt").read_text() != "MainThread", where
    folder = tmp_path / "zero2-kill" / "checkpoints"
    for entry in real_entries(folder):  # never a complete-looking wrong checkpoint
        verify_checkpoint(folder / entry)
    assert temporaries(folder), where
    assert read_checkpoint(folder / "last")["global_step"] == 6, where
    latest = find_latest_checkpoint(folder)
    assert latest is not None and read_checkpoint(latest)["global_step"] == 6, where

    resumed = run(tmp_path, "resume")
    assert resumed.returncode == 0, (where, output_tail(resumed))
    assert not temporaries(folder), where
    assert_same(final_weights(tmp_path, "zero2-kill"), final_weights(main_run, "zero2-sync"), where)


def test_accelerator_save_state_under_deepspeed_writes_in_the_background(main_run):
    # save_state(checkpoint_io=...) at step 3 of 8 returned before the folder existed, training
    # went on, and load_state (engine.load_checkpoint) gives back the weights of step 3.
    for rank, fact in enumerate(facts(main_run, "accelerator")):
        assert fact == {
            "save_count": 1, "is_in_flight": True, "loaded_is_step_3": True, "trained_on": True
        }, (rank, fact)  # fmt: skip
