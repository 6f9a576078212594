"""AsyncCheckpointIO: background saves that keep every promise of a synchronous one (DESIGN §6).

Real files, real threads, real ``kill -9``. Where a test must be sure that training went on while
a checkpoint was being written, the background writer is held back (the real writer, called late:
nothing of the filesystem is replaced). The subprocess tests run tests/plugins/async_job.py, the
fault matrix's regression job with ``plugins=[AsyncCheckpointIO()]``.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
import trainer.plugins.async_checkpoint as async_checkpoint
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.checkpoint import find_latest_checkpoint, read_checkpoint, verify_checkpoint
from trainer.checkpoint.atomic import is_temporary
from trainer.plugins import AsyncCheckpointIO
from trainer.plugins.async_checkpoint import find_checkpoint_io, snapshot_checkpoint
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.single import SingleDeviceStrategy
from trainer.strategies.xla import XLAStrategy

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "plugins" / "async_job.py"
TIMEOUT_S = 60


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _real_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not is_temporary(p.name))


def _step(folder: Path) -> int:
    return int(read_checkpoint(folder)["global_step"])


def _hold_writes(monkeypatch, until) -> list[str]:
    """Make each background write wait until ``until(checkpoint)`` is true; return the paths.

    The real writer runs afterwards: the files are real. A write that waits for more than
    TIMEOUT_S fails, so a test that breaks never hangs.
    """
    write = async_checkpoint.write_checkpoint
    written: list[str] = []

    def late(path, checkpoint, **kwargs):
        deadline = time.monotonic() + TIMEOUT_S
        while not until(checkpoint):
            if time.monotonic() > deadline:
                raise TimeoutError("the test never released the write")
            time.sleep(0.001)
        written.append(os.fspath(path))
        return write(path, checkpoint, **kwargs)

    monkeypatch.setattr(async_checkpoint, "write_checkpoint", late)
    return written


class RecordWeights(Callback):
    """The module's weights after each optimizer step, by global step."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.at[trainer.global_step] = _weights(module)


# ---- snapshot and wiring ---------------------------------------------------------------------
def test_snapshot_copies_every_tensor_keeps_tied_weights_tied_and_refuses_objects():
    weight = torch.ones(3)
    state = {"state_dict": {"a": weight, "b": weight}, "extra": [(1, weight[:2])], "n": 5}
    snapshot = snapshot_checkpoint(state)
    weight.add_(1)  # training goes on
    copied = snapshot.checkpoint
    assert torch.equal(copied["state_dict"]["a"], torch.ones(3)) and snapshot.events == []
    assert copied["state_dict"]["a"] is copied["state_dict"]["b"]  # stored once, as tied
    assert torch.equal(copied["extra"][0][1], torch.ones(2)) and copied["extra"][0][0] == 1
    assert len(snapshot.buffers) == 2
    again = snapshot_checkpoint(state, spare=snapshot.buffers)  # the written one's memory
    assert again.checkpoint["state_dict"]["a"] is copied["state_dict"]["a"]
    assert torch.equal(again.checkpoint["state_dict"]["a"], weight)
    with pytest.raises(trainer.CheckpointError, match=r"cannot store a object at 'extra\.x'"):
        snapshot_checkpoint({"extra": {"x": object()}})


def test_plugins_accept_one_async_checkpoint_io(tmp_path):
    io = AsyncCheckpointIO()
    assert quiet_trainer(tmp_path, plugins=[io]).checkpoint_io is io
    assert quiet_trainer(tmp_path, plugins=io).checkpoint_io is io
    assert quiet_trainer(tmp_path).checkpoint_io is None
    assert find_checkpoint_io(None) is None
    with pytest.raises(trainer.ConfigurationError, match="two AsyncCheckpointIO plugins"):
        quiet_trainer(tmp_path, plugins=[io, AsyncCheckpointIO()])
    with pytest.raises(trainer.ConfigurationError, match="AsyncCheckpointIO"):
        quiet_trainer(tmp_path, plugins=["async"])


def test_same_checkpoints_as_a_synchronous_run_and_saves_after_fit_are_synchronous(tmp_path):
    listings = {}
    for name, plugins in (("sync", None), ("async", [AsyncCheckpointIO()])):
        callback = ModelCheckpoint(
            every_n_train_steps=3, save_top_k=2, monitor="train/loss", save_last=True
        )
        t = quiet_trainer(
            tmp_path / name, max_epochs=2, callbacks=[callback], enable_checkpointing=True,
            plugins=plugins,
        )  # fmt: skip
        torch.manual_seed(0)
        t.fit(LinearModule(), make_loader())
        folder = tmp_path / name / "checkpoints"
        listings[name] = (_real_names(folder), os.path.basename(callback.best_model_path))
        assert _step(folder / "last") == 16
    assert listings["async"] == listings["sync"]
    assert t.save_checkpoint(tmp_path / "after-fit") is None  # returns once written
    verify_checkpoint(tmp_path / "after-fit")


# ---- each checkpoint holds its own step ----------------------------------------------------------
def test_each_checkpoint_holds_the_weights_of_its_own_step(tmp_path, monkeypatch):
    record = RecordWeights()
    callback = ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)
    t = quiet_trainer(
        tmp_path, max_steps=14, callbacks=[record, callback], enable_checkpointing=True,
        plugins=[AsyncCheckpointIO()],
    )  # fmt: skip
    # Each write starts only once training has taken 2 more optimizer steps (or ended).
    _hold_writes(monkeypatch, lambda ck: t.global_step >= min(ck["global_step"] + 2, 14))
    torch.manual_seed(0)
    t.fit(LinearModule(), make_loader(n=64))
    folder = tmp_path / "checkpoints"
    names = _real_names(folder)
    assert names == [f"epoch=0-step={s}" for s in (12, 3, 6, 9)]
    for name in names:
        step = _step(folder / name)
        saved = read_checkpoint(folder / name)["state_dict"]
        for key, tensor in record.at[step].items():
            assert torch.equal(saved[key], tensor), (name, key)
            assert not torch.equal(record.at[step + 2][key], tensor)  # training did move on


# ---- visible only when complete --------------------------------------------------------------
class ProbeWhileInFlight(Callback):
    """At step 5 (the save of step 4 held back): look at what is visible, then let it finish."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.seen: dict[str, object] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != 5:
            return
        callback = trainer.checkpoint_callback
        folder = Path(callback.dirpath)
        self.seen["names"] = _real_names(folder)
        self.seen["last_step"] = _step(folder / "last")
        self.seen["newest"] = _step(find_latest_checkpoint(folder))
        self.seen["best"] = os.path.basename(callback.best_model_path)
        self.release.set()
        trainer.checkpoint_io.wait()
        self.seen["after"] = (_real_names(folder), _step(folder / "last"))
        self.seen["best_after"] = os.path.basename(callback.best_model_path)


def test_checkpoint_last_and_rotation_visible_only_when_complete(tmp_path, monkeypatch):
    release = threading.Event()
    probe = ProbeWhileInFlight(release)
    callback = ModelCheckpoint(every_n_train_steps=2, save_top_k=1, save_last=True)
    t = quiet_trainer(
        tmp_path, max_steps=6, callbacks=[probe, callback], enable_checkpointing=True,
        plugins=[AsyncCheckpointIO()],
    )  # fmt: skip
    _hold_writes(monkeypatch, lambda ck: ck["global_step"] != 4 or release.is_set())
    t.fit(LinearModule(), make_loader())
    seen = probe.seen
    # While step 4 is written: its folder is absent, `last`, the newest and the best are step 2,
    # and step 2 (which step 4 pushes out of the top 1) is still there.
    assert seen["names"] == ["epoch=0-step=2", "last"]
    assert seen["last_step"] == 2 and seen["newest"] == 2 and seen["best"] == "epoch=0-step=2"
    # Once complete: step 4 in place, `last` swapped, step 2 rotated out.
    assert seen["after"] == (["epoch=0-step=4", "last"], 4)
    assert seen["best_after"] == "epoch=0-step=4"
    assert _real_names(tmp_path / "checkpoints") == ["epoch=0-step=6", "last"]


# ---- at most one in flight; fit returns only when the last save is complete ------------------
def test_one_save_in_flight_the_next_waits_and_the_wait_is_recorded(tmp_path, monkeypatch, caplog):
    active, overlaps = [0], []
    write = async_checkpoint.write_checkpoint

    def slow(path, checkpoint, **kwargs):
        active[0] += 1
        overlaps.append(active[0])
        time.sleep(0.2)
        try:
            return write(path, checkpoint, **kwargs)
        finally:
            active[0] -= 1

    monkeypatch.setattr(async_checkpoint, "write_checkpoint", slow)
    io = AsyncCheckpointIO()
    callback = ModelCheckpoint(every_n_train_steps=1, save_top_k=2, monitor="step", mode="max")
    t = quiet_trainer(
        tmp_path, max_steps=4, callbacks=[callback], enable_checkpointing=True, plugins=[io]
    )
    with caplog.at_level(logging.DEBUG, logger="trainer.plugins.async_checkpoint"):
        t.fit(LinearModule(), make_loader())
    assert max(overlaps) == 1 and io.save_count == 4
    assert 0.05 < io.last_wait_s < io.total_wait_s  # each save waited for the one before
    assert any("waited" in record.getMessage() for record in caplog.records)


def test_fit_returns_only_after_the_last_save_is_complete(tmp_path, monkeypatch):
    write = async_checkpoint.write_checkpoint

    def slow(path, checkpoint, **kwargs):
        time.sleep(0.5)
        return write(path, checkpoint, **kwargs)

    monkeypatch.setattr(async_checkpoint, "write_checkpoint", slow)
    io = AsyncCheckpointIO()
    callback = ModelCheckpoint(every_n_epochs=1, save_last=True)
    t = quiet_trainer(
        tmp_path, max_epochs=2, callbacks=[callback], enable_checkpointing=True, plugins=[io]
    )
    t.fit(LinearModule(), make_loader())
    folder = tmp_path / "checkpoints"
    assert _step(folder / "last") == 16 and _real_names(folder) == ["epoch=1-step=16", "last"]
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)]
    assert callback.best_model_path == str(folder / "epoch=1-step=16")
    assert io.total_wait_s > 0.3  # fit waited for it
    assert not [th for th in threading.enumerate() if th.name.startswith("trainer-async")]


# ---- failures are raised on the training thread, naming the checkpoint -----------------------
class SaveInto(Callback):
    """At ``step``, save to ``path`` and wait until its background write has ended."""

    def __init__(self, path: Path, step: int | None) -> None:
        self.path, self.step = path, step
        self.exceptions: list[BaseException] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            self._save(trainer)

    def on_train_end(self, trainer, module):
        if self.step is None:
            self._save(trainer)

    def on_exception(self, trainer, module, exception):
        self.exceptions.append(exception)

    def _save(self, trainer) -> None:
        pending = trainer.save_checkpoint(self.path)
        deadline = time.monotonic() + TIMEOUT_S
        while not pending.has_ended and time.monotonic() < deadline:
            time.sleep(0.001)


def test_a_background_failure_is_raised_at_the_next_step_naming_the_checkpoint(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    bad = tmp_path / "blocker" / "ck"
    saver = SaveInto(bad, step=3)
    callback = ModelCheckpoint(every_n_train_steps=2, save_last=True)
    t = quiet_trainer(
        tmp_path, max_steps=20, callbacks=[saver, callback], enable_checkpointing=True,
        plugins=[AsyncCheckpointIO()],
    )  # fmt: skip
    with pytest.raises(trainer.CheckpointError, match="background save of checkpoint") as info:
        t.fit(LinearModule(), make_loader())
    assert str(bad) in str(info.value) and "cannot create a checkpoint" in str(info.value)
    assert t.global_step == 4  # the next step boundary, before that step's own save
    assert saver.exceptions == [info.value] and t.state.status == "failed"
    folder = tmp_path / "checkpoints"
    assert _real_names(folder) == ["epoch=0-step=2", "last"]  # earlier checkpoints intact
    for name in _real_names(folder):
        verify_checkpoint(folder / name)


def test_a_failure_of_the_last_save_is_raised_by_fit(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    bad = tmp_path / "blocker" / "final"
    saver = SaveInto(bad, step=None)  # in on_train_end: written while fit ends
    t = quiet_trainer(tmp_path, max_steps=3, callbacks=[saver], plugins=[AsyncCheckpointIO()])
    with pytest.raises(trainer.CheckpointError, match=re.escape(str(bad))) as info:
        t.fit(LinearModule(), make_loader())
    assert saver.exceptions == [info.value] and t.state.status == "failed"


# ---- a strategy's pending device values are made final before the copy (XLA's mark_step) ------
class PendingValuesStrategy(SingleDeviceStrategy):
    """Stands for a lazy device (XLA): the weight's value is final only once
    `prepare_state_copy` ran; a copy taken before it would hold the stale value."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.module: torch.nn.Module | None = None
        self.calls = 0

    def prepare_state_copy(self) -> None:
        self.calls += 1
        with torch.no_grad():
            self.module.net.weight.fill_(float(self.calls))


def test_a_background_save_copies_the_state_after_the_strategy_made_it_final(tmp_path):
    strategy = PendingValuesStrategy()
    module = LinearModule()
    strategy.module = module

    class Save(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.save_checkpoint(tmp_path / f"step-{trainer.global_step}")

    t = quiet_trainer(
        tmp_path, max_steps=2, callbacks=[Save()], strategy=strategy,
        plugins=[AsyncCheckpointIO()],
    )  # fmt: skip
    t.fit(module, make_loader())
    assert strategy.calls == 2 and t.checkpoint_io.save_count == 2
    for step in (1, 2):
        weight = load_file(tmp_path / f"step-{step}" / "model.safetensors")["net.weight"]
        assert torch.all(weight == float(step)), (step, weight)


# ---- engines writing their own files (DeepSpeed's other writers) save synchronously ---------
class OwnFilesStrategy(SingleDeviceStrategy):
    """A strategy that writes its own checkpoint files (as DeepSpeed does; FSDP saves in the
    background through DCP instead: tests/plugins/test_async_sharded.py)."""

    def save_checkpoint(self, path, checkpoint):
        super().save_checkpoint(path, checkpoint)


def test_strategies_that_write_their_own_files_save_synchronously_with_one_warning(tmp_path):
    returned = []

    class Save(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            returned.append(trainer.save_checkpoint(tmp_path / f"step-{trainer.global_step}"))

    t = quiet_trainer(
        tmp_path, max_steps=3, callbacks=[Save()], strategy=OwnFilesStrategy("cpu"),
        plugins=[AsyncCheckpointIO()],
    )  # fmt: skip
    with pytest.warns(UserWarning, match="OwnFilesStrategy writes its own") as warned:
        t.fit(LinearModule(), make_loader())
    assert len([w for w in warned if "AsyncCheckpointIO" in str(w.message)]) == 1
    assert returned == [None, None, None]
    assert not async_checkpoint._writes_with_common_writer(FSDPStrategy())
    assert async_checkpoint._writes_with_common_writer(SingleDeviceStrategy("cpu"))
    assert async_checkpoint._writes_with_common_writer(XLAStrategy())  # the master writes it all


# ---- the Accelerator's save_state -------------------------------------------------------------
def _accelerator_run(tmp_path, *, is_automatic: bool = True):
    accelerator = trainer.Accelerator(
        cpu=True,
        project_config=trainer.ProjectConfiguration(
            project_dir=tmp_path, automatic_checkpoint_naming=is_automatic, total_limit=2
        ),
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, make_loader())
    return accelerator, model, optimizer, loader


def _accelerator_step(accelerator, model, optimizer, batch) -> None:
    x, y = batch
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()


def test_accelerator_save_state_in_the_background_prunes_only_when_complete(tmp_path, monkeypatch):
    release = threading.Event()
    _hold_writes(monkeypatch, lambda ck: ck["iteration"] != 2 or release.is_set())
    accelerator, model, optimizer, loader = _accelerator_run(tmp_path)
    io = AsyncCheckpointIO()
    folder = tmp_path / "checkpoints"
    saved = {}
    for iteration, batch in zip(range(3), loader):
        _accelerator_step(accelerator, model, optimizer, batch)
        saved[iteration] = _weights(model)
        accelerator.save_state(checkpoint_io=io)
    # checkpoint_2 is held back: absent, and checkpoint_0 (beyond total_limit=2) still there.
    assert _real_names(folder) == ["checkpoint_0", "checkpoint_1"]
    for batch in list(loader)[:2]:  # training goes on meanwhile
        _accelerator_step(accelerator, model, optimizer, batch)
    release.set()
    accelerator.load_state()  # waits for it, then loads the newest: checkpoint_2
    assert _real_names(folder) == ["checkpoint_1", "checkpoint_2"]
    for key, tensor in saved[2].items():
        assert torch.equal(model.state_dict()[key], tensor), key
    accelerator.end_training()


def test_accelerator_background_failure_is_raised_by_the_next_wait(tmp_path):
    accelerator, model, optimizer, loader = _accelerator_run(tmp_path, is_automatic=False)
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    io = AsyncCheckpointIO()
    _accelerator_step(accelerator, model, optimizer, next(iter(loader)))
    bad = tmp_path / "blocker" / "state"
    assert accelerator.save_state(bad, checkpoint_io=io) == str(bad)  # returns at once
    with pytest.raises(trainer.CheckpointError, match=re.escape(str(bad))):
        accelerator.end_training()


# ---- real processes: resume, disk full, kill -9, SIGTERM --------------------------------------
def run_job(root: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(JOB), str(root), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, **kwargs,
    )  # fmt: skip


def _assert_same_weights(root: Path, mode: str, reference: dict[str, torch.Tensor], where: str):
    final = load_file(str(root / f"final-{mode}.safetensors"))
    assert final.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(final[name], tensor), f"{name} differs ({where})"


def _assert_no_half_checkpoint(folder: Path) -> None:
    for entry in sorted(folder.iterdir()):
        if not is_temporary(entry.name):
            verify_checkpoint(entry)  # raises CheckpointError when torn or corrupt


@pytest.fixture(scope="module")
def synchronous_weights(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of the uninterrupted job with synchronous saves."""
    root = tmp_path_factory.mktemp("sync")
    result = run_job(root, "full", "--sync")
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(str(root / "final-full.safetensors"))


@pytest.mark.slow
def test_async_run_and_its_resume_end_with_the_synchronous_run_weights(
    tmp_path, synchronous_weights
):
    full = run_job(tmp_path / "full", "full")
    assert full.returncode == 0, full.stderr[-3000:]
    _assert_same_weights(tmp_path / "full", "full", synchronous_weights, "uninterrupted")
    first = run_job(tmp_path / "resumed", "first-half")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_job(tmp_path / "resumed", "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "start step 6" in resumed.stdout
    _assert_same_weights(tmp_path / "resumed", "resume", synchronous_weights, "resumed")


@pytest.mark.slow
def test_disk_full_in_the_background_is_raised_naming_the_checkpoint(tmp_path):
    first = run_job(tmp_path, "first-half")
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "checkpoints"
    before = {p.name: p.stat().st_mtime for p in folder.iterdir()}

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))  # smaller than any weights file

    result = run_job(tmp_path, "resume", preexec_fn=limit_file_size)
    assert result.returncode == 1, result.stderr[-3000:]
    last_line = result.stderr.strip().splitlines()[-1]
    assert "CheckpointError" in last_line and "background save" in last_line, last_line
    # The save of step 8 that runs first: the top-k checkpoint if its loss ranks, else `last`.
    assert "epoch=1-step=8" in last_line or ".last.tmp-" in last_line, last_line
    assert "File too large" in last_line, last_line
    assert {p.name: p.stat().st_mtime for p in folder.iterdir()} == before
    _assert_no_half_checkpoint(folder)


# (operation, its n-th occurrence from the save at step 8 on, the step resume starts from):
# the first file, a file's fsync and the rename into place of the top-k checkpoint (all on the
# writer thread, before the checkpoint of step 8 exists); then the rename of the staged `last`
# (step 8 is complete under its name, `last` not yet swapped).
KILLS = [("open", 1, 6), ("fsync", 3, 6), ("rename", 1, 6), ("rename", 2, 8)]


@pytest.mark.slow
@pytest.mark.parametrize(("op", "n", "start"), KILLS)
def test_kill_9_during_a_background_write_leaves_temporaries_and_resumes_exactly(
    tmp_path, synchronous_weights, op, n, start
):
    killed = run_job(tmp_path, "kill", op, str(n))
    where = f"kill -9 at {op} #{n}"
    assert killed.returncode == -signal.SIGKILL, (where, killed.stderr[-3000:])
    assert (tmp_path / "killed-on-thread.txt").read_text() != "MainThread"  # not the loop's
    folder = tmp_path / "checkpoints"
    _assert_no_half_checkpoint(folder)
    assert any(is_temporary(p.name) for p in folder.iterdir()), where
    assert _step(find_latest_checkpoint(folder)) == start, where

    resumed = run_job(tmp_path, "resume")
    assert resumed.returncode == 0, (where, resumed.stderr[-3000:])
    assert f"start step {start}" in resumed.stdout, where
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)], where
    _assert_same_weights(tmp_path, "resume", synchronous_weights, where)


@pytest.mark.slow
def test_sigterm_completes_the_save_in_flight_and_its_own_before_exiting(
    tmp_path, synchronous_weights
):
    result = run_job(tmp_path, "preempt")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "received SIGTERM; saved a checkpoint at step 8" in result.stderr
    folder = tmp_path / "checkpoints"
    assert {"last", "preempted-epoch=1-step=8"} <= set(_real_names(folder))
    _assert_no_half_checkpoint(folder)
    assert not [p.name for p in folder.iterdir() if is_temporary(p.name)]
    assert _step(folder / "last") == 8  # the swap that waited for the save of step 8 ran
    resumed = run_job(tmp_path, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_weights(tmp_path, "resume", synchronous_weights, "after SIGTERM")
