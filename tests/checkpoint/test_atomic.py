"""What may be replaced, deleted or cleaned up as trainer's own: a folder whose manifest trainer
wrote (`has_trainer_manifest`), and temporary siblings named as trainer names them
(`is_temporary`, `remove_stale_temporaries`) (trainer/checkpoint/atomic.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

import trainer
from trainer.checkpoint import atomic, read_checkpoint, write_checkpoint
from trainer.checkpoint.atomic import (
    has_trainer_manifest,
    is_temporary,
    process_tag,
    remove_stale_temporaries,
    unlisted_files,
)
from trainer.errors import CheckpointError

_CHECKPOINT = {"state_dict": {"w": torch.ones(2)}, "epoch": 0, "global_step": 1}


# ---- a folder is trainer's only when its manifest says so -----------------------------------
@pytest.mark.parametrize(
    "manifest",
    ['{"images": ["a.png"]}', '{"name": "my pwa", "format": "pwa"}', "[1, 2]", "not json"],
)
def test_a_folder_with_a_foreign_manifest_is_never_replaced(tmp_path: Path, manifest: str) -> None:
    user = tmp_path / "my_dataset"
    user.mkdir()
    (user / "manifest.json").write_text(manifest)
    (user / "a.png").write_bytes(b"precious user data")
    with pytest.raises(CheckpointError, match=r"not a checkpoint \(it holds a.png, manifest.json"):
        write_checkpoint(user, _CHECKPOINT)
    assert sorted(os.listdir(user)) == ["a.png", "manifest.json"]
    assert (user / "a.png").read_bytes() == b"precious user data"
    assert os.listdir(tmp_path) == ["my_dataset"]  # no temporary left behind


def test_trainer_save_checkpoint_never_replaces_a_web_app_folder(tmp_path: Path) -> None:
    from tests.conftest import LinearModule, make_loader, quiet_trainer

    webapp = tmp_path / "webapp"
    webapp.mkdir()
    (webapp / "manifest.json").write_text('{"name": "my pwa"}')
    (webapp / "index.html").write_text("<html>precious</html>")
    t = quiet_trainer(tmp_path, max_steps=1)
    t.fit(LinearModule(), make_loader())
    with pytest.raises(trainer.CheckpointError, match="webapp: it is a folder that is not"):
        t.save_checkpoint(webapp)
    assert (webapp / "index.html").read_text() == "<html>precious</html>"


def test_a_checkpoint_of_any_version_is_replaced(tmp_path: Path) -> None:
    current = write_checkpoint(tmp_path / "current", _CHECKPOINT)
    assert has_trainer_manifest(current)
    # What the first version wrote: the format marker, no blake3, no extra fields.
    older = tmp_path / "older"
    older.mkdir()
    (older / "stale.bin").write_bytes(b"old")
    first = {"format": "trainer-checkpoint", "format_version": 1, "files": {"stale.bin": {}}}
    (older / "manifest.json").write_text(json.dumps(first))
    assert has_trainer_manifest(older)
    write_checkpoint(older, {**_CHECKPOINT, "global_step": 2})
    assert read_checkpoint(older)["global_step"] == 2 and not (older / "stale.bin").exists()


def test_a_checkpoint_a_user_added_files_to_is_never_replaced(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", _CHECKPOINT)
    assert unlisted_files(folder) == []
    (folder / "eval.txt").write_text("accuracy 0.93")
    (folder / "plots").mkdir()
    (folder / "plots" / "loss.png").write_bytes(b"png")
    (folder / "empty").mkdir()  # holds nothing: not counted
    os.symlink(tmp_path, folder / "elsewhere")  # a link to a folder counts, never followed
    assert unlisted_files(folder) == ["elsewhere", "eval.txt", "plots/loss.png"]
    with pytest.raises(
        CheckpointError, match=r"files its manifest does not list \(elsewhere, eval"
    ):
        write_checkpoint(folder, {**_CHECKPOINT, "global_step": 2})
    assert (folder / "eval.txt").read_text() == "accuracy 0.93"
    (folder / "elsewhere").unlink()
    assert read_checkpoint(folder, verify=False)["global_step"] == 1


def test_has_trainer_manifest_refuses_what_is_not_one_without_reading_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = write_checkpoint(tmp_path / "ck", _CHECKPOINT)
    text = (ours / "manifest.json").read_text()
    assert not has_trainer_manifest(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    assert not has_trainer_manifest(tmp_path / "empty")
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(ours / "manifest.json", linked / "manifest.json")
    assert not has_trainer_manifest(linked)  # a link to one is not one
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / "manifest.json")
    assert not has_trainer_manifest(pipe)  # returns at once: a FIFO is never opened to wait
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "manifest.json").write_text("[" * 100_000)
    assert not has_trainer_manifest(deep)
    monkeypatch.setattr(atomic, "MANIFEST_MAX_BYTES", len(text) - 1)
    assert not has_trainer_manifest(ours)  # too large to be a manifest: refused unread
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        write_checkpoint(ours, _CHECKPOINT)


# ---- stale temporaries: only the names trainer writes ---------------------------------------
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (".epoch=0-step=2.tmp-{tag}", True),  # {tag}: this process's
        (".epoch=0-step=2.old-4242-node7.example-0a1b2c3d", True),
        (".epoch=0-step=2.tmp-4242-0a1b2c3d", True),  # earlier versions: no host
        (".step=4.tmp-dcp-0a1b2c3d4e5f", True),  # earlier sharded staging
        ("..last.tmp-{tag}.tmp-{tag}", True),  # `last`, staged then written
        (".env.old-2023", False),
        (".venv.old-py310", False),
        (".backup.old-20231231", False),
        (".notes.tmp-draft", False),
        (".tmp-4242-0a1b2c3d", False),  # no name before the mark
        ("epoch=0-step=2.tmp-4242-0a1b2c3d", False),  # not hidden
        (".epoch=0-step=2.tmp-4242-0A1B2C3D", False),  # the id is lowercase hex
    ],
)
def test_is_temporary_is_only_the_names_trainer_writes(name: str, expected: bool) -> None:
    assert is_temporary(name.format(tag=process_tag())) is expected


def test_stale_cleanup_never_removes_a_users_hidden_backups(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # above the default pid_max: no such process
    host = process_tag().split("-", 1)[1].rsplit("-", 1)[0]
    (tmp_path / ".venv.old-py310" / "lib").mkdir(parents=True)
    (tmp_path / ".venv.old-py310" / "lib" / "site.py").write_text("x")
    (tmp_path / ".env.old-2023").write_text("SECRET=keep me")
    (tmp_path / ".backup.old-20231231").write_text("keep")
    ours = [f".epoch=0-step=2.tmp-{dead}-{host}-0123abcd", ".epoch=0-step=4.tmp-1-0123abcd"]
    for name in ours:
        (tmp_path / name).mkdir()
    old = time.time() - 3 * 24 * 3600
    for entry in tmp_path.iterdir():
        os.utime(entry, (old, old))
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted(ours)
    assert sorted(os.listdir(tmp_path)) == [
        ".backup.old-20231231",
        ".env.old-2023",
        ".venv.old-py310",
    ]
    assert (tmp_path / ".env.old-2023").read_text() == "SECRET=keep me"
