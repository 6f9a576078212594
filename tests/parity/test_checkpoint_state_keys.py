"""Parity by difference: several ModelCheckpoints in one Trainer, each with its own state.

Lightning keys a ModelCheckpoint's state by its monitor, mode and triggers, so a per-step and a
per-epoch checkpointer resume each with its own state, and two with the same key are refused.
Each scenario runs on lightning.pytorch 2.6 and on trainer; the folders kept and the callbacks'
attributes after a resumed fit are compared with an uninterrupted fit's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from tests.parity.frameworks import BOTH, LIGHTNING, Framework, quiet, regression

pl = pytest.importorskip("lightning.pytorch")


def _kept(folder: Path) -> list[str]:
    return sorted(name.removesuffix(".ckpt") for name in os.listdir(folder))


def _checkpointers(fw: Framework, root: Path) -> list[Any]:
    return [
        fw.callbacks.ModelCheckpoint(
            dirpath=str(root / "steps"), filename="s-{step}", every_n_train_steps=3
        ),
        fw.callbacks.ModelCheckpoint(
            dirpath=str(root / "epochs"), filename="e-{epoch}", save_last=True
        ),
    ]


def _fit(fw: Framework, root: Path, max_epochs: int, ckpt_path: str | None = None) -> list[Any]:
    callbacks = _checkpointers(fw, root)
    module = regression(fw.Module)()
    run = fw.trainer(**quiet(enable_checkpointing=True, callbacks=callbacks, max_epochs=max_epochs))
    run.fit(module, _loader(), ckpt_path=ckpt_path)
    return callbacks


def _loader() -> Any:
    from tests.parity.frameworks import loader

    return loader(16, batch_size=4)


def _outcome(root: Path, callbacks: list[Any]) -> dict[str, Any]:
    def name(path: str) -> str:
        return os.path.basename(path).removesuffix(".ckpt")

    return {
        "steps": _kept(root / "steps"),
        "epochs": _kept(root / "epochs"),
        "best": [name(cb.best_model_path) for cb in callbacks],
        "last": [name(cb.last_model_path) for cb in callbacks],
    }


def test_two_checkpointers_resume_each_with_its_own_state(tmp_path: Path) -> None:
    """A per-step and a per-epoch checkpointer: fit 2 epochs, resume from ``last`` to 4; both
    frameworks keep what an uninterrupted 4-epoch fit keeps (no stale ``s-step=6``)."""
    outcomes = {}
    for fw in BOTH:
        whole = tmp_path / fw.name / "whole"
        outcomes[fw.name, "whole"] = _outcome(whole, _fit(fw, whole, 4))
        resumed = tmp_path / fw.name / "resumed"
        _fit(fw, resumed, 2)
        last = resumed / "epochs" / ("last.ckpt" if fw is LIGHTNING else "last")
        outcomes[fw.name, "resumed"] = _outcome(resumed, _fit(fw, resumed, 4, str(last)))
    assert outcomes["trainer", "whole"] == outcomes["lightning", "whole"]
    assert outcomes["trainer", "resumed"] == outcomes["lightning", "resumed"]
    assert outcomes["trainer", "resumed"] == outcomes["trainer", "whole"]


def test_state_keys_are_lightnings() -> None:
    for options in ({}, {"monitor": "val_loss", "mode": "max"}, {"every_n_train_steps": 3}):
        expected = pl.callbacks.ModelCheckpoint(**options).state_key
        assert trainer.callbacks.ModelCheckpoint(**options).state_key == expected


def test_two_checkpointers_with_one_state_key_are_refused(tmp_path: Path) -> None:
    def build(fw: Framework) -> str:
        twins = [
            fw.callbacks.ModelCheckpoint(dirpath=str(tmp_path / fw.name / n), monitor="val_loss")
            for n in ("a", "b")
        ]
        try:
            fw.trainer(**quiet(enable_checkpointing=True, callbacks=twins))
        except (RuntimeError, trainer.ConfigurationError) as err:
            return type(err).__name__
        return "accepted"

    assert build(LIGHTNING) == "RuntimeError"
    assert build(BOTH[1]) == "ConfigurationError"


def test_a_checkpoint_with_the_earlier_short_key_still_restores(tmp_path: Path) -> None:
    """Checkpoints written before the triggers joined the key hold
    ``ModelCheckpoint{'monitor': ..., 'mode': ...}``: resuming one restores that state."""

    def checkpointer() -> Any:
        folder = str(tmp_path / "ck")
        return trainer.callbacks.ModelCheckpoint(dirpath=folder, monitor="val/loss", save_top_k=-1)

    first = checkpointer()
    quiet_trainer(tmp_path, callbacks=[first], enable_checkpointing=True, max_epochs=1).fit(
        LinearModule(), make_loader(), make_loader(8)
    )
    saved = Path(first.best_model_path)
    state = saved / "state.json"
    text, count = re.subn(
        r", 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None\}",
        "}",
        state.read_text(),
    )
    assert count == 1 and "ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min'}" in text
    state.write_text(text)
    manifest_path = saved / "manifest.json"  # the edited file's record, as if written so
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["state.json"] = {
        "size": state.stat().st_size,
        "sha256": hashlib.sha256(state.read_bytes()).hexdigest(),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    again = checkpointer()
    run = quiet_trainer(tmp_path, callbacks=[again], enable_checkpointing=True, max_epochs=2)
    run.fit(LinearModule(), make_loader(), make_loader(8), ckpt_path=str(saved))
    assert str(saved) in again.best_k_models  # the first fit's, restored, then ranked on
    assert len(again.best_k_models) == 2
