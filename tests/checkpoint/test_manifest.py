"""The manifest's ``epoch`` and ``global_step`` (which ``ckpt_path="last"`` ranks by, after the
manifest's time) must be ``state.json``'s: an edited one is refused, and ``last`` skips it
(trainer/checkpoint/manifest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import find_latest_checkpoint, read_checkpoint, write_checkpoint
from trainer.checkpoint.format import read_state, verify_checkpoint
from trainer.errors import CheckpointError

_FUTURE = "2999-01-01T00:00:00+00:00"  # a manifest time that ranks first


def _checkpoint(folder: Path, step: int) -> Path:
    return write_checkpoint(
        folder,
        {"state_dict": {"w": torch.full((2,), float(step))}, "epoch": 0, "global_step": step},
    )


def _edit_manifest(folder: Path, **fields: object) -> None:
    """What anyone can do: the manifest is the one file no digest covers."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(fields)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("read", [verify_checkpoint, read_checkpoint, read_state])
@pytest.mark.parametrize(
    ("field", "value", "saved"),
    [("global_step", 10**6, 1), ("global_step", 0, 1), ("global_step", None, 1), ("epoch", 7, 0)],
)
def test_a_manifest_position_that_is_not_state_json_s_is_refused(
    tmp_path: Path, read, field: str, value: object, saved: int
) -> None:
    folder = _checkpoint(tmp_path / "step=1", 1)
    _edit_manifest(folder, **{field: value})
    with pytest.raises(CheckpointError) as refused:
        read(folder)
    message = str(refused.value)
    assert f"manifest.json: field {field!r} is {value!r} but state.json says {saved!r}" in message


def test_last_skips_an_older_checkpoint_whose_manifest_step_was_raised(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        _checkpoint(tmp_path / f"epoch=0-step={step}", step)
    # ranked first (its manifest also says it was written last), then refused by verification
    _edit_manifest(tmp_path / "epoch=0-step=1", global_step=10**6, created=_FUTURE)
    with pytest.warns(UserWarning, match=r"epoch=0-step=1.*'global_step' is 1000000"):
        assert find_latest_checkpoint(tmp_path) == tmp_path / "epoch=0-step=4"


def test_resume_from_last_ignores_an_older_checkpoint_with_a_raised_manifest_step(
    tmp_path: Path,
) -> None:
    from tests.conftest import LinearModule, make_loader, quiet_trainer
    from trainer.callbacks import Callback, ModelCheckpoint

    folder = tmp_path / "checkpoints"  # where ckpt_path="last" looks
    callback = ModelCheckpoint(every_n_train_steps=1, save_top_k=-1)
    t = quiet_trainer(tmp_path, max_steps=4, callbacks=[callback], enable_checkpointing=True)
    t.fit(LinearModule(), make_loader())
    _edit_manifest(folder / "epoch=0-step=1", global_step=10**6, created=_FUTURE)
    steps: list[int] = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            steps.append(trainer.global_step)

    resumed = quiet_trainer(tmp_path, max_steps=6, callbacks=[Record()])
    with pytest.warns(UserWarning, match="epoch=0-step=1"):
        resumed.fit(LinearModule(), make_loader(), ckpt_path="last")
    assert steps == [4, 5]  # resumed after step 4, the newest
