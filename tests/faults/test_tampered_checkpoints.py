"""Fault matrix, part 3: a tampered checkpoint is refused before anything is restored (#13, #21).

One real checkpoint (a short fit, stopped mid-epoch) is damaged in each way a copy, a disk or an
attacker can damage it. The "consistent" cases re-hash the manifest afterwards, as anyone who
can write the folder can, so only the content checks can refuse them. Every case must raise
``CheckpointError`` from ``fit(ckpt_path=...)`` before training starts, leave the module's
parameters untouched, and run no code (a pickle payload would create a marker file).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.checkpoint.resume_job import Net, data
from tests.conftest import quiet_trainer
from trainer.checkpoint.format import MANIFEST
from trainer.errors import CheckpointError


class _Payload:
    """Unpickling this runs ``os.system``: it touches the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def rehash(folder: Path) -> None:
    """Recompute every file record in the manifest (and list files added to the folder)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    names = sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.name != MANIFEST and not p.is_dir()
    )
    manifest["files"] = {
        name: {
            "size": (folder / name).stat().st_size,
            "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
        }
        for name in names
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))


def flip_byte(folder: Path, marker: Path) -> None:
    path = folder / "model.safetensors"
    data_bytes = bytearray(path.read_bytes())
    data_bytes[-5] ^= 0xFF
    path.write_bytes(bytes(data_bytes))


def truncate(folder: Path, marker: Path) -> None:
    path = folder / "optimizer.safetensors"
    path.write_bytes(path.read_bytes()[:-16])


def remove_file(folder: Path, marker: Path) -> None:
    (folder / "state.json").unlink()


def add_file(folder: Path, marker: Path) -> None:
    (folder / "notes.txt").write_text("added after the save")


def pickle_in_place_of_weights(folder: Path, marker: Path) -> None:
    (folder / "model.safetensors").write_bytes(pickle.dumps(_Payload(marker)))
    rehash(folder)


def extra_pickle_file(folder: Path, marker: Path) -> None:
    (folder / "optimizer.bin").write_bytes(pickle.dumps(_Payload(marker)))
    rehash(folder)


def extra_pickle_in_a_folder(folder: Path, marker: Path) -> None:
    (folder / "extra").mkdir()
    (folder / "extra" / "payload.pkl").write_bytes(pickle.dumps(_Payload(marker)))
    rehash(folder)


def symlink_to_outside(folder: Path, marker: Path) -> None:
    outside = folder.parent / f"outside-{folder.name}.safetensors"
    shutil.move(folder / "model.safetensors", outside)
    (folder / "model.safetensors").symlink_to(outside)
    rehash(folder)


def manifest_removed(folder: Path, marker: Path) -> None:
    (folder / MANIFEST).unlink()  # a copy that stopped halfway, a stripped archive
    flip_byte(folder, marker)


def manifest_a_folder(folder: Path, marker: Path) -> None:
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).mkdir()
    flip_byte(folder, marker)


def edit_state(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def tamper(folder: Path, marker: Path) -> None:
        state = json.loads((folder / "state.json").read_text())
        change(state)
        (folder / "state.json").write_text(json.dumps(state))
        rehash(folder)

    return tamper


def _set(path: str, value: object) -> Callable[[dict], None]:
    *parents, last = path.split(".")

    def change(state: dict) -> None:
        node = state
        for key in parents:
            node = node[key]
        node[last] = value

    return change


def _delete(path: str) -> Callable[[dict], None]:
    *parents, last = path.split(".")

    def change(state: dict) -> None:
        node = state
        for key in parents:
            node = node[key]
        del node[last]

    return change


TAMPERINGS = {
    "byte flipped": flip_byte,
    "truncated": truncate,
    "file missing": remove_file,
    "file added": add_file,
    "manifest removed, byte flipped": manifest_removed,
    "manifest a folder, byte flipped": manifest_a_folder,
    "pickle payload as weights (re-hashed)": pickle_in_place_of_weights,
    "pickle payload as extra file (re-hashed)": extra_pickle_file,
    "pickle payload in an extra folder (re-hashed)": extra_pickle_in_a_folder,
    "symbolic link to a file outside (re-hashed)": symlink_to_outside,
    "string epoch (re-hashed)": edit_state(_set("progress.epoch", "1")),
    "missing global_step (re-hashed)": edit_state(_delete("progress.global_step")),
    "progress is a list (re-hashed)": edit_state(_set("progress", [0, 3, 3])),
    "negative batch_idx (re-hashed)": edit_state(_set("progress.batch_idx", -3)),
    "huge global_step (re-hashed)": edit_state(_set("progress.global_step", 10**30)),
    "is_epoch_ending a string (re-hashed)": edit_state(_set("progress.is_epoch_ending", "no")),
    "batches_stepped negative (re-hashed)": edit_state(_set("progress.batches_stepped", -1)),
}


# The file a refusal must name, where the case is about one file the format does not define.
NAMED = {
    "file added": "notes.txt",
    "manifest removed, byte flipped": MANIFEST,
    "manifest a folder, byte flipped": MANIFEST,
    "pickle payload as extra file (re-hashed)": "optimizer.bin",
    "pickle payload in an extra folder (re-hashed)": "extra/payload.pkl",
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tampered")
    torch.manual_seed(0)
    run = quiet_trainer(root, max_epochs=2, max_steps=3)
    run.fit(Net(), data())
    run.save_checkpoint(root / "ck")
    return root / "ck"


@pytest.mark.parametrize("case", list(TAMPERINGS))
def test_tampered_checkpoint_is_refused_before_anything_is_restored(tmp_path, saved, case):
    folder = tmp_path / "ck"
    shutil.copytree(saved, folder)
    marker = tmp_path / "payload-ran"
    TAMPERINGS[case](folder, marker)
    torch.manual_seed(1)
    module = Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    run = quiet_trainer(tmp_path / "run", max_epochs=2)
    with pytest.raises(CheckpointError) as error:
        run.fit(module, data(), ckpt_path=str(folder))
    assert str(folder) in str(error.value) or folder.name in str(error.value), str(error.value)
    assert NAMED.get(case, "") in str(error.value), str(error.value)
    assert not marker.exists(), "a pickle payload ran"
    assert run.global_step == 0
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} was restored from a refused checkpoint"


def test_the_engines_shard_folders_are_files_of_the_format():
    """A sharded save writes its engine's files under a folder the verifier accepts."""
    from trainer.checkpoint.format import ENGINE_DIRS, is_format_file
    from trainer.checkpoint.sharded import DCP_DIR
    from trainer.strategies.deepspeed import ENGINE_DIR

    assert {DCP_DIR, ENGINE_DIR} <= set(ENGINE_DIRS)
    assert is_format_file(f"{DCP_DIR}/__0_0.distcp") and is_format_file(f"{DCP_DIR}/.metadata")
    assert is_format_file(f"{ENGINE_DIR}/global_step3/mp_rank_00_model_states.pt")
    assert not is_format_file("optimizer.bin") and not is_format_file(f"{DCP_DIR}/../x.pkl")


# ---- load_checkpoint_in_model verifies a checkpoint folder and confines a model index (#21) ----
@pytest.mark.parametrize("case", list(TAMPERINGS))
def test_load_checkpoint_in_model_refuses_a_tampered_checkpoint(tmp_path, saved, case):
    """The weights-only loader verifies the folder first: the same matrix, the same refusals."""
    from trainer import load_checkpoint_in_model

    folder = tmp_path / "ck"
    shutil.copytree(saved, folder)
    marker = tmp_path / "payload-ran"
    TAMPERINGS[case](folder, marker)
    torch.manual_seed(1)
    module = Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(CheckpointError) as error:
        load_checkpoint_in_model(module, folder, strict=True)
    assert folder.name in str(error.value), str(error.value)
    assert NAMED.get(case, "") in str(error.value), str(error.value)
    assert not marker.exists(), "a pickle payload ran"
    _assert_untouched(module, before)


def _assert_untouched(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} was loaded from a refused checkpoint"


def _sharded_folder(root: Path, ours: bool) -> Path:
    """Net's weights in shards with an index: a trainer checkpoint, or a plain save_model one."""
    from trainer.checkpoint.format import write_checkpoint, write_model_files

    torch.manual_seed(0)
    state = Net().state_dict()
    folder = root / ("ck" if ours else "hf")
    if ours:
        write_checkpoint(folder, {"state_dict": state, "epoch": 0, "global_step": 0},
                         max_shard_size=100)  # fmt: skip
    else:
        folder.mkdir()
        write_model_files(folder, state, max_shard_size=100)
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    return folder


def _point_index_at(folder: Path, value: Callable[[Path, str], str]) -> tuple[str, str]:
    """Make the index's first entry name ``value(folder, shard)``; returns (tensor, value)."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    tensor, shard = sorted(index["weight_map"].items())[0]
    index["weight_map"][tensor] = value(folder, shard)
    index_path.write_text(json.dumps(index))
    return tensor, index["weight_map"][tensor]


def _outside_copy(folder: Path, shard: str) -> Path:
    """A valid shard outside the folder, holding the same tensors with other values (7s)."""
    from safetensors.torch import load_file, save_file

    outside = folder.parent / "outside" / shard
    outside.parent.mkdir(exist_ok=True)
    save_file({k: torch.full_like(v, 7.0) for k, v in load_file(folder / shard).items()}, outside)
    return outside


def index_absolute(folder: Path) -> tuple[str, str]:
    return _point_index_at(folder, lambda f, shard: str(_outside_copy(f, shard)))


def index_parent(folder: Path) -> tuple[str, str]:
    return _point_index_at(folder, lambda f, shard: f"../outside/{_outside_copy(f, shard).name}")


def shard_symlinked(folder: Path) -> tuple[str, str]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensor, shard = sorted(index["weight_map"].items())[0]
    outside = _outside_copy(folder, shard)
    (folder / shard).unlink()
    (folder / shard).symlink_to(outside)
    return tensor, shard


def shard_in_symlinked_folder(folder: Path) -> tuple[str, str]:
    """The index names ``inner/<shard>``, where ``inner`` links to a folder outside."""
    tensor, value = _point_index_at(
        folder, lambda f, shard: f"inner/{_outside_copy(f, shard).name}"
    )
    (folder / "inner").symlink_to(folder.parent / "outside", target_is_directory=True)
    return tensor, value


def shard_byte_flipped(folder: Path) -> tuple[str, str]:
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    data_bytes = bytearray(shard.read_bytes())
    data_bytes[-1] ^= 0xFF
    shard.write_bytes(bytes(data_bytes))
    return "", shard.name


INDEX_TAMPERINGS = {
    "index names an absolute path": index_absolute,
    "index names ../": index_parent,
    "shard is a symbolic link": shard_symlinked,
    "shard inside a linked folder": shard_in_symlinked_folder,
    "shard byte flipped": shard_byte_flipped,
}


@pytest.mark.parametrize("ours", [True, False], ids=["trainer checkpoint", "save_model folder"])
@pytest.mark.parametrize("case", list(INDEX_TAMPERINGS))
def test_load_checkpoint_in_model_reads_no_shard_outside_the_folder(tmp_path, case, ours):
    """Every file a model index names stays inside its folder, with or without a manifest.

    A trainer checkpoint is verified as a whole first (an attacker re-hashes its manifest); a
    folder without a manifest (``save_model``, a Hugging Face download) has its index confined.
    """
    from trainer import load_checkpoint_and_dispatch, load_checkpoint_in_model

    if case == "shard byte flipped" and not ours:
        pytest.skip("a folder without a manifest has no hashes to check")
    folder = _sharded_folder(tmp_path, ours)
    control = Net()
    assert load_checkpoint_in_model(control, folder, strict=True)["missing_keys"] == []
    tensor, value = INDEX_TAMPERINGS[case](folder)
    if ours and case != "shard byte flipped":
        rehash(folder)  # only the path checks can refuse it now
    if case == "shard byte flipped":
        expected = rf"{value} does not match its sha256"
    elif ours and "link" in case:  # a trainer checkpoint with a link anywhere is refused whole
        expected = r"is a symbolic link \(to "
    else:  # the file, the field and the value
        expected = (
            rf"model\.safetensors\.index\.json, field 'weight_map\.{tensor}': the path "
            rf"{re.escape(repr(value))} (is absolute|leaves the folder|goes through the symbolic)"
        )
    torch.manual_seed(1)
    module = Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    for load in (
        lambda: load_checkpoint_in_model(module, folder, strict=True),
        lambda: load_checkpoint_in_model(module, folder / "model.safetensors.index.json"),
        lambda: load_checkpoint_and_dispatch(module, folder, device_map={"": "cpu"}),
    ):
        with pytest.raises(CheckpointError, match=expected):
            load()
        _assert_untouched(module, before)
