"""``trainer checkpoint consolidate``: a folder, a file inside a checkpoint or (without --force) an
existing file as OUT is one ``error:`` line and stays as it was (trainer/cli/checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import write_checkpoint
from trainer.checkpoint.tensor_files import read_safetensors
from trainer.cli.main import main


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(
        tmp_path / "ck", {"state_dict": {"w": torch.arange(4.0)}, "epoch": 0, "global_step": 1}
    )


@pytest.mark.parametrize("content", [["notes.txt"], []], ids=["with-files", "empty"])
def test_consolidate_into_a_folder_is_an_error_line_and_leaves_it(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: list[str]
) -> None:
    out = tmp_path / "exported"
    out.mkdir()
    for name in content:
        (out / name).write_text("mine")
    assert main(["checkpoint", "consolidate", str(checkpoint), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: trainer checkpoint consolidate: the output {str(out)!r} is a folder"
    )
    assert "model.safetensors" in err and "Traceback" not in err
    assert out.is_dir() and sorted(os.listdir(out)) == content
    assert sorted(os.listdir(tmp_path)) == ["ck", "exported"]  # no temporary left behind


def test_consolidate_where_the_output_cannot_be_written_is_an_error_line(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("mine")
    out = tmp_path / "a-file" / "full.safetensors"  # its parent is a file
    assert main(["checkpoint", "consolidate", str(checkpoint), str(out)]) == 1
    assert capsys.readouterr().err.startswith("error: trainer checkpoint consolidate: cannot write")
    assert (tmp_path / "a-file").read_text() == "mine"


def test_consolidate_replaces_an_existing_file_only_with_force(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "full.safetensors"
    out.write_bytes(b"an earlier export")
    assert main(["checkpoint", "consolidate", str(checkpoint), str(out)]) == 1
    assert f"{str(out)!r} exists. Pass --force" in capsys.readouterr().err
    assert out.read_bytes() == b"an earlier export"
    assert main(["checkpoint", "consolidate", str(checkpoint), str(out), "--force"]) == 0
    assert torch.equal(read_safetensors(str(out))[0]["w"], torch.arange(4.0))
    assert sorted(os.listdir(tmp_path)) == ["ck", "full.safetensors"]


@pytest.mark.parametrize("force", [False, True])
def test_consolidate_never_writes_inside_a_checkpoint(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], force: bool
) -> None:
    other = write_checkpoint(
        tmp_path / "other", {"state_dict": {"w": torch.ones(2)}, "epoch": 0, "global_step": 2}
    )
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    for out in (other / "model.safetensors", other / "new.safetensors", checkpoint / "x.st"):
        args = ["checkpoint", "consolidate", str(checkpoint), str(out)] + ["--force"] * force
        assert main(args) == 1
        assert "is inside the trainer checkpoint" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert main(["checkpoint", "verify", str(other)]) == 0


def test_verify_says_when_a_checkpoint_is_an_accelerators_with_save_hook_files(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer import Accelerator

    def save_hook(models, weights, output_dir):
        Path(output_dir, "tokenizer.json").write_text("{}")

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 1))
    accelerator.register_save_state_pre_hook(save_hook)
    saved = accelerator.save_state(tmp_path / "state")
    assert main(["checkpoint", "verify", str(saved)]) == 0
    assert "save-hook files under extra/: an Accelerator checkpoint" in capsys.readouterr().out
    assert main(["checkpoint", "verify", str(checkpoint)]) == 0
    assert "Accelerator" not in capsys.readouterr().out
