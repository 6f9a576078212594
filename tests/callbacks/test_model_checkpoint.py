"""ModelCheckpoint: a real ``last`` directory, confined restored state, exact top-k on resume,
stale temporary folders of dead processes removed (trainer/callbacks/model_checkpoint.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.callbacks.checkpoint_folder import delete_checkpoint
from trainer.checkpoint import read_checkpoint

SCORES = [3.0, 1.0, 2.0, 0.0, 5.0, 4.0]  # per epoch; top-2 by min: epochs 1 and 3
CRASH_STEP = 9  # 2 batches per epoch: the first batch of epoch 4


class Scored(LinearModule):
    def validation_step(self, batch, batch_idx):
        self.log("score", SCORES[self.current_epoch])


class Crash(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("crash")


def _fit(root: Path, *, ckpt_path=None, max_epochs=6, callbacks=(), **options) -> ModelCheckpoint:
    callback = ModelCheckpoint(
        **{"monitor": "score", "save_top_k": 2, "save_last": True, **options}
    )
    t = quiet_trainer(
        root, max_epochs=max_epochs, callbacks=[callback, *callbacks], enable_checkpointing=True
    )
    torch.manual_seed(0)
    t.fit(Scored(), make_loader(n=8), make_loader(n=8), ckpt_path=ckpt_path)
    return callback


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _step(folder: Path) -> int:
    return int(read_checkpoint(folder)["global_step"])


# ---- 1. `last` is a real directory, replaced atomically -------------------------------------
def test_last_is_a_real_checkpoint_directory_holding_the_newest_save(tmp_path):
    callback = _fit(tmp_path)
    last = tmp_path / "checkpoints" / "last"
    assert last.is_dir() and not last.is_symlink() and (last / "manifest.json").is_file()
    assert _step(last) == 12 and callback.last_model_path == str(last)
    assert _names(tmp_path / "checkpoints") == ["epoch=1-step=4", "epoch=3-step=8", "last"]


def test_a_copied_run_resumes_from_last_and_saves_again(tmp_path):
    _fit(tmp_path / "run", max_epochs=3)
    shutil.copytree(tmp_path / "run", tmp_path / "copy")  # links become real folders
    assert not (tmp_path / "copy" / "checkpoints" / "last").is_symlink()
    callback = _fit(tmp_path / "copy", ckpt_path="last")
    last = tmp_path / "copy" / "checkpoints" / "last"
    assert last.is_dir() and not last.is_symlink() and _step(last) == 12
    assert callback.best_model_path == str(tmp_path / "copy" / "checkpoints" / "epoch=3-step=8")


def test_an_old_symlink_last_still_resumes_and_is_replaced_by_a_directory(tmp_path):
    folder = tmp_path / "checkpoints"
    _fit(tmp_path, max_epochs=2, save_last=False)
    os.symlink("epoch=1-step=4", folder / "last")  # the layout earlier versions wrote
    steps = []

    class Record(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            steps.append(trainer.global_step)

    _fit(tmp_path, ckpt_path="last", max_epochs=3, callbacks=[Record()])
    assert steps == [5, 6]  # resumed after step 4
    assert not (folder / "last").is_symlink() and _step(folder / "last") == 6
    assert (folder / "epoch=1-step=4" / "manifest.json").is_file()  # the link's target survives


@pytest.mark.parametrize("absolute", [False, True])
def test_a_symlink_last_that_save_last_tracked_still_resumes(tmp_path, absolute):
    folder = tmp_path / "checkpoints"
    _fit(tmp_path, max_epochs=2)  # save_last=True: the state tracks `last`
    shutil.rmtree(folder / "last")
    target = folder / "epoch=1-step=4" if absolute else "epoch=1-step=4"
    os.symlink(target, folder / "last")  # the layout earlier versions wrote

    callback = _fit(tmp_path, ckpt_path="last", max_epochs=3)
    assert not (folder / "last").is_symlink() and _step(folder / "last") == 6
    assert callback.last_model_path == str(folder / "last")
    assert (folder / "epoch=1-step=4" / "manifest.json").is_file()  # the link's target survives


def test_a_flattened_last_link_is_replaced_but_a_foreign_folder_is_refused(tmp_path):
    folder = tmp_path / "checkpoints"
    _fit(tmp_path, max_epochs=2, save_last=False)
    (folder / "last").write_text("epoch=1-step=4")  # a link flattened by an archive tool
    _fit(tmp_path, max_epochs=1)
    assert (folder / "last" / "manifest.json").is_file()
    assert (folder / "epoch=1-step=4" / "manifest.json").is_file()  # what it named survives

    other = tmp_path / "other"
    (other / "checkpoints" / "last").mkdir(parents=True)
    (other / "checkpoints" / "last" / "notes.txt").write_text("mine")
    # The version counter (Lightning's default) leaves a taken name alone: `last-v1` instead.
    callback = _fit(other, max_epochs=1)
    assert Path(callback.last_model_path).name == "last-v1"
    with pytest.raises(trainer.CheckpointError, match="last.*notes.txt"):
        _fit(other, max_epochs=1, enable_version_counter=False)
    assert (other / "checkpoints" / "last" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "text",
    [
        "last experiment: lr=0.1 diverged at step 400, try 0.03\n",  # notes, not a name
        "epoch=1-step=4",  # a name, but nothing of that name beside it
        "data",  # a name of a folder that is not a checkpoint
        "data/../epoch=0-step=2",  # not a plain name
    ],
)
def test_a_user_file_named_last_is_never_replaced(tmp_path, text):
    folder = tmp_path / "checkpoints"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "manifest.json").write_text('{"images": ["a.png"]}')
    (folder / "last").write_text(text)
    # The version counter (Lightning's default) leaves a taken name alone: `last-v1` instead.
    callback = _fit(tmp_path, max_epochs=1)
    assert Path(callback.last_model_path).name == "last-v1"
    assert (folder / "last").read_text() == text
    with pytest.raises(trainer.CheckpointError, match=r"checkpoints/last: it is a file"):
        _fit(tmp_path / "other", max_epochs=1, enable_version_counter=False, dirpath=folder)
    assert (folder / "last").read_text() == text


def test_last_is_never_absent_while_it_is_replaced(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    seen: list[bool] = []
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def watch(name, real):
        def wrapper(*args, **kwargs):
            if (folder / "last").exists():
                seen.append((folder / "last" / "manifest.json").is_file())
            elif seen:
                seen.append(False)
            result = real(*args, **kwargs)
            if seen:
                seen.append((folder / "last" / "manifest.json").is_file())
            return result

        return wrapper

    monkeypatch.setattr(os, "rename", watch("rename", real_rename))
    monkeypatch.setattr(shutil, "rmtree", watch("rmtree", real_rmtree))
    _fit(tmp_path, max_epochs=4)
    assert seen and all(seen)


# ---- 2. restored state is confined to dirpath and type-checked -------------------------------
def _state(folder: Path, **fields) -> dict:
    state = {
        "dirpath": str(folder),
        "monitor": "score",
        "best_model_path": "",
        "best_model_score": None,
        "best_k_models": {},
        "last_model_path": "",
        "saved": [],
    }
    state.update(fields)
    return state


def _callback(folder: Path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1)


def _checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text('{"format": "trainer-checkpoint"}')  # only whose
    return folder


@pytest.mark.parametrize("field", ["best_k_models", "best_model_path", "last_model_path", "saved"])
def test_a_restored_path_outside_dirpath_is_refused(tmp_path, field):
    victim = _checkpoint(tmp_path / "elsewhere")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    value = {str(victim): 0.5} if field == "best_k_models" else str(victim)
    if field == "saved":
        value = [str(victim)]
    with pytest.raises(trainer.CheckpointError, match=rf"{field}.*elsewhere"):
        _callback(folder).load_state_dict(_state(folder, **{field: value}))
    escape = str(folder / ".." / "elsewhere")
    with pytest.raises(trainer.CheckpointError, match=rf"{field}.*elsewhere"):
        _callback(folder).load_state_dict(
            _state(folder, best_k_models={escape: 0.5})
            if field == "best_k_models"
            else _state(folder, **{field: [escape] if field == "saved" else escape})
        )
    assert (victim / "manifest.json").is_file()


def test_a_restored_path_through_a_symlink_is_refused(tmp_path):
    victim = _checkpoint(tmp_path / "elsewhere")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    os.symlink(victim, folder / "epoch=0-step=1")
    state = _state(folder, best_k_models={str(folder / "epoch=0-step=1"): 0.5})
    with pytest.raises(trainer.CheckpointError, match="best_k_models.*symbolic link"):
        _callback(folder).load_state_dict(state)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("best_k_models", ["a", "b"]),
        ("best_k_models", {"epoch=0-step=1": "high"}),
        ("best_model_score", "0.5"),
        ("best_model_path", 3),
        ("last_model_path", ["x"]),
        ("saved", "epoch=0-step=1"),
        ("dirpath", 7),
    ],
)
def test_a_restored_field_of_the_wrong_type_is_refused(tmp_path, field, value):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    with pytest.raises(trainer.CheckpointError, match=rf"{field}.*{type(value).__name__}"):
        _callback(folder).load_state_dict(_state(folder, **{field: value}))


def test_rotation_never_deletes_a_tracked_folder_that_is_not_a_checkpoint(tmp_path):
    folder = tmp_path / "checkpoints"
    data = folder / "data"
    data.mkdir(parents=True)
    (data / "table.csv").write_text("1,2")
    callback = ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1)
    with pytest.warns(UserWarning, match="not a checkpoint"):
        callback.load_state_dict(_state(folder, best_k_models={str(data): 9.0}))
    assert callback.best_k_models == {}
    callback.best_k_models[str(data)] = 9.0  # even if it got there, rotation leaves it alone
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[callback], enable_checkpointing=True)
    t.fit(Scored(), make_loader(n=8), make_loader(n=8))
    assert (data / "table.csv").read_text() == "1,2"


def test_rotation_never_deletes_a_folder_whose_manifest_trainer_did_not_write(tmp_path):
    folder = tmp_path / "checkpoints"
    webapp = folder / "webapp"
    webapp.mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name": "my pwa"}')  # a web app's, not ours
    (webapp / "index.html").write_text("<html>mine</html>")
    callback = ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1)
    with pytest.warns(UserWarning, match="not a checkpoint"):
        callback.load_state_dict(_state(folder, best_k_models={str(webapp): 9.0}))
    assert callback.best_k_models == {}
    delete_checkpoint(str(webapp), str(folder))  # what rotation calls
    assert sorted(p.name for p in webapp.iterdir()) == ["index.html", "manifest.json"]


def test_a_checkpoint_a_user_added_files_to_is_kept_by_rotation_and_by_last(tmp_path):
    folder = tmp_path / "checkpoints"
    _fit(tmp_path, max_epochs=2)  # top 2 by min of SCORES[:2]: epochs 0 and 1, and `last`
    assert _names(folder) == ["epoch=0-step=2", "epoch=1-step=4", "last"]
    (folder / "epoch=0-step=2" / "eval.txt").write_text("mine")
    (folder / "last" / "NOTES.md").write_text("mine too")

    with pytest.warns(UserWarning, match=r"epoch=0-step=2.*does not list \(eval.txt\): kept"):
        callback = _fit(tmp_path, max_epochs=3, ckpt_path=str(folder / "epoch=1-step=4"))
    assert (folder / "epoch=0-step=2" / "eval.txt").read_text() == "mine"
    assert (folder / "last" / "NOTES.md").read_text() == "mine too"
    assert _step(folder / "last-v1") == 6 and callback.last_model_path == str(folder / "last-v1")
    assert sorted(callback.best_k_models) == [
        str(folder / f) for f in ("epoch=1-step=4", "epoch=2-step=6")
    ]

    with pytest.raises(trainer.CheckpointError, match=r"last: it is a checkpoint holding files"):
        _fit(
            tmp_path / "again",
            max_epochs=1,
            dirpath=folder,
            save_top_k=0,
            enable_version_counter=False,
        )
    assert (folder / "last" / "NOTES.md").read_text() == "mine too"


# ---- 3. resume bookkeeping: the same kept set as an uninterrupted run, and as Lightning -------
def _crash_then_resume(root: Path) -> ModelCheckpoint:
    with pytest.raises(RuntimeError, match="crash"):
        _fit(root, callbacks=[Crash(CRASH_STEP)])
    return _fit(root, ckpt_path="last")


def _outcome(callback: ModelCheckpoint, folder: Path, suffix: str = "") -> tuple:
    names = [n.removesuffix(suffix) for n in _names(folder)]
    best = Path(callback.best_model_path).name.removesuffix(suffix)
    last = Path(callback.last_model_path).name.removesuffix(suffix)
    return names, best, last


def test_resumed_top_k_keeps_the_same_checkpoints_as_an_uninterrupted_run(tmp_path):
    full = _fit(tmp_path / "full")
    resumed = _crash_then_resume(tmp_path / "resumed")
    expected = (["epoch=1-step=4", "epoch=3-step=8", "last"], "epoch=3-step=8", "last")
    assert _outcome(full, tmp_path / "full" / "checkpoints") == expected
    assert _outcome(resumed, tmp_path / "resumed" / "checkpoints") == expected
    assert sorted(Path(p).name for p in resumed.best_k_models) == expected[0][:2]
    assert _step(tmp_path / "resumed" / "checkpoints" / "last") == 12


def test_resumed_top_k_matches_lightning(tmp_path):
    L = pytest.importorskip("lightning.pytorch")

    class LightningScored(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            self.log("score", SCORES[self.current_epoch])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class LightningCrash(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == CRASH_STEP:
                raise RuntimeError("crash")

    def lightning_fit(root: Path, ckpt_path=None, callbacks=()):
        callback = L.callbacks.ModelCheckpoint(monitor="score", save_top_k=2, save_last=True)
        t = L.Trainer(
            default_root_dir=root,
            max_epochs=6,
            callbacks=[callback, *callbacks],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        t.fit(LightningScored(), make_loader(n=8), make_loader(n=8), ckpt_path=ckpt_path)
        return callback

    with pytest.raises(RuntimeError, match="crash"):
        lightning_fit(tmp_path / "lightning", callbacks=[LightningCrash()])
    reference = lightning_fit(tmp_path / "lightning", ckpt_path="last")
    ours = _crash_then_resume(tmp_path / "ours")
    assert _outcome(ours, tmp_path / "ours" / "checkpoints") == _outcome(
        reference, tmp_path / "lightning" / "checkpoints", ".ckpt"
    )


# ---- 4. stale temporary folders --------------------------------------------------------------
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporary_folders_of_dead_processes_are_removed_at_the_next_save(tmp_path):
    from trainer.checkpoint.atomic import process_tag

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    dead, alive = _dead_pid(), os.getpid()
    host = process_tag().split("-", 1)[1].rsplit("-", 1)[0]
    stale = [
        f".epoch=0-step=2.tmp-{dead}-{host}-0123abcd",
        f".last.old-{dead}-{host}-0123abcd",
        f".epoch=0-step=2.tmp-{dead}-0123abcd",  # no host in the name (older versions): old mtime
    ]
    kept = [
        f".epoch=0-step=4.tmp-{alive}-{host}-0123abcd",  # a live process: never touched
        f".epoch=0-step=4.tmp-{dead}-otherhost-0123abcd",  # another machine's, recent
        f".epoch=0-step=4.tmp-{dead}-0123abcd",  # no host, recent
    ]
    for name in stale + kept:
        (folder / name).mkdir()
        (folder / name / "model.safetensors").write_text("partial")
    old = time.time() - 3 * 24 * 3600
    os.utime(folder / stale[2], (old, old))
    _fit(tmp_path, max_epochs=1)
    remaining = set(_names(folder))
    assert not remaining & set(stale)
    assert set(kept) <= remaining


def test_a_last_copy_from_an_earlier_version_is_removed_once_the_new_last_is_in_place(tmp_path):
    folder = tmp_path / "checkpoints"
    old_copy = _checkpoint(folder / "last-epoch=0-step=2")  # earlier versions' non-top-k `last`
    callback = ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1, save_last=True)
    callback.load_state_dict(_state(folder, last_model_path=str(old_copy)))
    assert callback.last_model_path == str(old_copy)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback], enable_checkpointing=True)
    t.fit(Scored(), make_loader(n=8), make_loader(n=8))
    assert _names(folder) == ["epoch=0-step=2", "last"]


def test_a_failed_write_leaves_the_bookkeeping_as_it_was(tmp_path):
    callback = ModelCheckpoint(monitor="score", save_top_k=2, save_last=True)
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[callback], enable_checkpointing=True)
    real_save = t.save_checkpoint

    def fail_in_epoch_1(path, weights_only=False):
        if t.current_epoch == 1:
            raise trainer.CheckpointError("disk full")
        real_save(path, weights_only=weights_only)

    t.save_checkpoint = fail_in_epoch_1
    with pytest.raises(trainer.CheckpointError, match="disk full"):
        t.fit(Scored(), make_loader(n=8), make_loader(n=8))
    folder = tmp_path / "checkpoints"
    assert [Path(p).name for p in callback.best_k_models] == ["epoch=0-step=2"]
    assert callback.best_model_path == str(folder / "epoch=0-step=2")
    assert callback.last_model_path == str(folder / "last") and _step(folder / "last") == 2
