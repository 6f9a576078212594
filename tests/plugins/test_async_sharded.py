"""Background sharded saves (trainer/plugins/async_sharded.py, trainer/checkpoint/sharded_async.py)
in one process: a gloo group of world size 1, so FSDP2 shards over a 1-rank mesh and DCP's
``async_save`` writes real shard files on its own thread. The 2-process runs (equality with
synchronous saves, resume, failures, kill -9) are in tests/distributed/test_async_checkpoint_fsdp.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import ModelCheckpoint
from trainer.checkpoint import read_checkpoint, verify_checkpoint
from trainer.checkpoint.atomic import is_temporary, remove_stale_temporaries
from trainer.checkpoint.sharded import DCP_DIR, agree_on_staging, load_sharded_checkpoint
from trainer.checkpoint.sharded_async import start_async_sharded_save
from trainer.errors import CheckpointError
from trainer.plugins import AsyncCheckpointIO, PendingSave
from trainer.plugins.async_checkpoint import _THREAD_NAME
from trainer.plugins.async_sharded import saves_sharded, stager_is_reusable
from trainer.strategies import DDPStrategy, FSDPStrategy


@pytest.fixture
def strategy(process_group: None) -> FSDPStrategy:
    strategy = FSDPStrategy("cpu")
    strategy.setup_environment()  # reuses the group, builds the 1-D mesh
    return strategy


def _prepare(strategy: FSDPStrategy) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = strategy.setup_module(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)))
    return model, strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=0.1))


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _checkpoint(strategy: FSDPStrategy, model, optimizer, step: int, **rest) -> dict:
    return {
        "state_dict": strategy.module_state_dict(model, full=False),
        "optimizer_states": [strategy.optimizer_state_dict(optimizer)],
        "global_step": step,
        **rest,
    }


def _full(strategy: FSDPStrategy, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in strategy.module_state_dict(model, full=True).items()}


def _stager() -> DefaultStager:
    return DefaultStager(StagingOptions(False, False, False, False))


def test_which_strategies_save_sharded_in_the_background():
    assert saves_sharded(FSDPStrategy("cpu"))
    assert not saves_sharded(FSDPStrategy("cpu", state_dict_type="FULL"))  # process 0 writes
    assert not saves_sharded(DDPStrategy("cpu"))


def test_the_state_is_copied_before_start_returns_and_written_to_every_destination(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    model, optimizer = _prepare(strategy)
    _step(model, optimizer)
    saved = _full(strategy, model)
    checkpoint = _checkpoint(strategy, model, optimizer, 1, epoch=0)
    group = dist.new_group(backend="gloo")
    stager = _stager()
    try:
        save = start_async_sharded_save(
            strategy, tmp_path / "step=1", checkpoint, process_group=group, stager=stager
        )
        second = save.add_destination(tmp_path / "copy")
        for _ in range(2):  # training goes on before anything is written
            _step(model, optimizer)
        save.write(0)
        save.write(second)
    finally:
        stager.close()
        dist.destroy_process_group(group)
    assert not torch.equal(_full(strategy, model)["0.weight"], saved["0.weight"])
    assert save.destinations == [tmp_path / "step=1", tmp_path / "copy"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "store") == ["copy", "step=1"]
    for name in ("step=1", "copy"):
        manifest = verify_checkpoint(tmp_path / name)  # digests over the shards too
        assert f"{DCP_DIR}/.metadata" in manifest["files"] and manifest["global_step"] == 1
        loaded = load_sharded_checkpoint(strategy, tmp_path / name, model, [optimizer])
        strategy.load_module_state_dict(model, loaded["state_dict"])
        assert (loaded["epoch"], loaded["global_step"]) == (0, 1)
        restored = _full(strategy, model)
        for key, value in saved.items():  # the weights of step 1, not of step 3
            torch.testing.assert_close(restored[key], value, rtol=0, atol=0)


def test_refusals_are_raised_before_any_shard_is_written(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    model, optimizer = _prepare(strategy)
    foreign = tmp_path / "state"
    foreign.mkdir()
    (foreign / "optimizer.bin").write_bytes(b"user data")
    group = dist.new_group(backend="gloo")
    stager = _stager()
    try:
        with pytest.raises(CheckpointError, match="not a checkpoint"):
            start_async_sharded_save(
                strategy, foreign, _checkpoint(strategy, model, optimizer, 0),
                process_group=group, stager=stager,
            )  # fmt: skip
        unstorable = _checkpoint(strategy, model, optimizer, 0, extra={"handle": object()})
        with pytest.raises(CheckpointError, match=r"state\.extra\.handle"):
            start_async_sharded_save(
                strategy, tmp_path / "ck", unstorable, process_group=group, stager=stager
            )
    finally:
        stager.close()
        dist.destroy_process_group(group)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state", "store"]  # no staging folder
    assert (foreign / "optimizer.bin").read_bytes() == b"user data"


def test_a_folder_that_cannot_be_created_is_refused_before_anything_is_staged(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    """A background failure with its cause: tests/distributed/test_async_checkpoint_fsdp.py
    (disk full on process 0)."""
    model, optimizer = _prepare(strategy)
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    group = dist.new_group(backend="gloo")
    stager = _stager()
    try:
        with pytest.raises(
            CheckpointError, match="cannot create checkpoint .*blocker/ck.*File exists"
        ):
            start_async_sharded_save(
                strategy, tmp_path / "blocker" / "ck", _checkpoint(strategy, model, optimizer, 0),
                process_group=group, stager=stager,
            )  # fmt: skip
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing staged
    finally:
        stager.close()
        dist.destroy_process_group(group)


def test_a_staging_folder_belongs_to_process_0_and_is_removed_once_it_is_gone(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    staging = agree_on_staging(strategy, tmp_path / "epoch=0-step=4", DCP_DIR)
    assert staging.parent == tmp_path and is_temporary(staging.name)
    staging.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    left_behind = tmp_path / staging.name.replace(
        f".tmp-{os.getpid()}-", f".tmp-{dead.stdout.strip()}-"
    )
    left_behind.mkdir()
    assert remove_stale_temporaries(tmp_path) == [left_behind.name]  # a killed save's
    assert staging.is_dir()  # this live process's: kept


@pytest.mark.parametrize("state_dict_type", ["SHARDED", "FULL"])
def test_fit_with_fsdp_saves_in_the_background(
    process_group: None, tmp_path: Path, state_dict_type: str
) -> None:
    # SHARDED: every process writes DCP shards; FULL: process 0 writes the gathered state.
    returned: list[object] = []
    checkpoint = ModelCheckpoint(every_n_train_steps=2, save_last=True)
    io = AsyncCheckpointIO()
    t = quiet_trainer(
        tmp_path, max_steps=6, strategy=FSDPStrategy("cpu", state_dict_type=state_dict_type),
        plugins=[io], callbacks=[checkpoint], enable_checkpointing=True,
    )  # fmt: skip
    original = t.save_checkpoint

    def save(path, weights_only=False):
        returned.append(original(path, weights_only=weights_only))
        return returned[-1]

    t.save_checkpoint = save  # what ModelCheckpoint received
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "saved synchronously" warning
        t.fit(LinearModule(), make_loader())
    assert io.save_count == 3 and all(isinstance(p, PendingSave) for p in returned)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=6", "last"]
    for name in ("epoch=0-step=6", "last"):
        assert (folder / name / DCP_DIR).is_dir() == (state_dict_type == "SHARDED")
        assert (folder / name / "model.safetensors").is_file() == (state_dict_type == "FULL")
        verify_checkpoint(folder / name)
        assert read_checkpoint(folder / name)["global_step"] == 6
    assert t.save_checkpoint(tmp_path / "after") is None  # after fit: synchronous
    verify_checkpoint(tmp_path / "after")


def test_accelerator_save_state_under_fsdp_writes_shards_in_the_background(
    process_group: None, tmp_path: Path
) -> None:
    import trainer

    accelerator = trainer.Accelerator(strategy=FSDPStrategy("cpu"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(model, optimizer)
    saved = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    io = AsyncCheckpointIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # not "saved synchronously"
        folder = accelerator.save_state(tmp_path / "state", checkpoint_io=io)
    _step(model, optimizer)  # training goes on while the shards are written
    io.wait()
    assert io.save_count == 1 and (Path(folder) / DCP_DIR / ".metadata").is_file()
    verify_checkpoint(folder)
    accelerator.load_state(folder)
    restored = accelerator.get_state_dict(model)
    for key, value in saved.items():
        torch.testing.assert_close(restored[key], value, rtol=0, atol=0)
    # end_training frees what the background saves held; before, the gloo group of the sharded
    # saves and the writer thread stayed until the process ended.
    groups = len(dist.distributed_c10d._world.pg_map)
    accelerator.end_training()
    assert len(dist.distributed_c10d._world.pg_map) == groups - 1
    assert not [t for t in threading.enumerate() if t.name.startswith(_THREAD_NAME)]


class OneShotStager(DefaultStager):
    """torch 2.11's DefaultStager: it closes its copier at the end of every staging."""

    def stage(self, state_dict, **kwargs):
        staged = super().stage(state_dict, **kwargs)
        self._state_dict_stager.close()  # what torch 2.11's DefaultStager._stage does
        return staged


def test_one_save_stages_once_so_a_stager_that_stages_once_serves_it(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    """On an H200 with torch 2.11 a background FSDP save failed with KeyError: <class 'type'>:
    the shards and the rest of the checkpoint were staged in two calls."""
    model, optimizer = _prepare(strategy)
    _step(model, optimizer)
    group = dist.new_group(backend="gloo")
    stager = OneShotStager(StagingOptions(False, False, False, False))
    try:
        save = start_async_sharded_save(
            strategy, tmp_path / "ck", _checkpoint(strategy, model, optimizer, 1, epoch=0),
            process_group=group, stager=stager,
        )  # fmt: skip
        save.write(0)
    finally:
        dist.destroy_process_group(group)
    loaded = read_checkpoint(tmp_path / "ck")
    assert loaded["global_step"] == 1 and loaded["epoch"] == 0
    verify_checkpoint(tmp_path / "ck")


def test_a_stager_is_reused_only_where_torch_lets_it_stage_twice():
    """torch 2.11's DefaultStager closes itself after each staging (pytorch#183413): the second
    background FSDP save failed with KeyError: <class 'type'> on an H200 with torch 2.11."""
    assert not stager_is_reusable("2.11.0+cu130")
    assert not stager_is_reusable("2.12.1")
    assert stager_is_reusable("2.13.0") and stager_is_reusable("2.14.0.dev20261101")
    if stager_is_reusable():  # this torch: a stager stages again after a first staging
        stager = DefaultStager(StagingOptions(False, False, False, False))
        for step in range(2):
            staged = stager.stage({"w": torch.full((4,), float(step)), "kind": torch.Tensor})
            assert torch.equal(staged["w"], torch.full((4,), float(step)))
        stager.close()
