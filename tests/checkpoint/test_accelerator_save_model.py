"""Accelerator.save_model into a folder that already holds files: what it replaces, what it keeps."""

from __future__ import annotations

import json

import pytest
import torch

from trainer import Accelerator
from trainer.checkpoint import verify_checkpoint
from trainer.errors import CheckpointError

# An earlier save's weights, in every form save_model (ours or Hugging Face Accelerate's) writes.
_OLD_WEIGHTS = (
    "model.safetensors",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model-00001-of-00002.bin",
    "pytorch_model.bin.index.json",
)
# The user's files, some of whose names start like a weight file's.
_USER_FILES = {
    "config.json": "{}",
    "modeling_custom.py": "class MyModel: ...",
    "model_card.md": "# my card",
    "models/notes.txt": "notes",
    "model.safetensors.bak": "an old copy",
    "pytorch_model_v1.bin": "kept",
    "model_1.safetensors": "not a save_model name",
}


def test_save_model_replaces_only_earlier_weight_files(tmp_path):
    folder = tmp_path / "export"
    (folder / "models").mkdir(parents=True)
    for name, text in _USER_FILES.items():
        (folder / name).write_text(text)
    for name in _OLD_WEIGHTS:
        (folder / name).write_text("old weights")
    accelerator = Accelerator(cpu=True)

    accelerator.save_model(accelerator.prepare(torch.nn.Linear(2, 2)), folder)

    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert names == sorted([*_USER_FILES, "model.safetensors"])
    assert all((folder / name).read_text() == text for name, text in _USER_FILES.items())


def test_save_model_refuses_a_folder_named_like_a_weight_file(tmp_path):
    folder = tmp_path / "export"
    (folder / "model.safetensors").mkdir(parents=True)
    (folder / "model.safetensors" / "mine.txt").write_text("mine")
    accelerator = Accelerator(cpu=True)

    with pytest.raises(CheckpointError, match=r"model\.safetensors is a folder"):
        accelerator.save_model(accelerator.prepare(torch.nn.Linear(2, 2)), folder)
    assert (folder / "model.safetensors" / "mine.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no temporary folder left


def test_save_model_refuses_a_trainer_checkpoint_and_leaves_it_whole(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    checkpoint = tmp_path / "ckpt"
    accelerator.save_state(checkpoint)
    before = sorted(p.name for p in checkpoint.iterdir())

    with pytest.raises(CheckpointError, match=r"ckpt is a trainer checkpoint.*another directory"):
        accelerator.save_model(model, checkpoint)
    with pytest.raises(CheckpointError, match=r"export is inside .*ckpt, which is a trainer"):
        accelerator.save_model(model, checkpoint / "export")

    assert sorted(p.name for p in checkpoint.iterdir()) == before
    verify_checkpoint(checkpoint)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary folder left


def test_save_model_keeps_a_manifest_json_that_is_not_a_checkpoints(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "my-dataset", "files": {}}))
    accelerator = Accelerator(cpu=True)

    accelerator.save_model(accelerator.prepare(torch.nn.Linear(2, 2)), folder)

    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "model.safetensors"]
