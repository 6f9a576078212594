"""ModelCheckpoint's Lightning 2.6 options beyond what tests/parity compares: ``save_last="link"``,
``format_checkpoint_name``, the ``kth_*`` state, a monitor missing before any validation, ``~`` in
``dirpath`` (trainer/callbacks/model_checkpoint.py, checkpoint_naming.py, checkpoint_triggers.py)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import ModelCheckpoint


class Scored(LinearModule):
    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.current_epoch % 2))


def _fit(root: Path, callback: ModelCheckpoint, *, validate: bool = True, **options) -> None:
    t = quiet_trainer(root, callbacks=[callback], enable_checkpointing=True, **options)
    val = [make_loader(n=8)] if validate else []
    t.fit(Scored(), make_loader(n=8), *val)


def test_save_last_link_writes_a_real_directory(tmp_path):
    callback = ModelCheckpoint(save_last="link")
    _fit(tmp_path, callback, max_epochs=2)
    last = tmp_path / "checkpoints" / "last"
    assert last.is_dir() and not last.is_symlink() and (last / "manifest.json").is_file()
    assert callback.last_model_path == str(last)


def test_format_checkpoint_name_has_lightnings_signature(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{val/loss:.2f}")
    metrics = {"epoch": 2, "val/loss": torch.tensor(0.1234)}
    assert callback.format_checkpoint_name(metrics) == str(tmp_path / "epoch=2-val_loss=0.12")
    assert callback.format_checkpoint_name(metrics, ver=3, prefix="run").endswith(
        "run-epoch=2-val_loss=0.12-v3"
    )
    assert (
        ModelCheckpoint(auto_insert_metric_name=False).format_checkpoint_name(
            {"epoch": 1, "step": 8}
        )
        == "1-8"
    )
    with pytest.raises(trainer.ConfigurationError, match="nope"):
        callback.format_checkpoint_name({}, filename="{nope}")


def test_kth_state_round_trips_and_is_checked(tmp_path):
    callback = ModelCheckpoint(monitor="score", save_top_k=1, mode="max")
    _fit(tmp_path, callback, max_epochs=3)
    state = callback.state_dict()
    assert state["kth_best_model_path"] == callback.best_model_path  # top 1: the best is the kth
    assert state["kth_value"] == 1.0 and state["current_score"] == 1.0
    restored = ModelCheckpoint(monitor="score", save_top_k=1, mode="max")
    restored.dirpath = callback.dirpath
    restored.load_state_dict(state)
    assert restored.kth_best_model_path == callback.kth_best_model_path
    assert float(restored.kth_value) == 1.0 and float(restored.current_score) == 1.0
    with pytest.raises(trainer.CheckpointError, match="kth_value.*str"):
        restored.load_state_dict({**state, "kth_value": "high"})


def test_a_monitor_missing_before_any_validation_warns_once_and_saves_only_last(tmp_path):
    callback = ModelCheckpoint(monitor="val_score", save_last=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(tmp_path, callback, validate=False, max_epochs=3)
    messages = [str(w.message) for w in caught if "val_score" in str(w.message)]
    assert len(messages) == 1 and "was not logged" in messages[0]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["last"]
    assert callback.best_model_path == "" and callback.best_k_models == {}


def test_every_n_train_steps_zero_turns_the_epoch_default_off(tmp_path):
    callback = ModelCheckpoint(every_n_train_steps=0)
    assert (callback.every_n_train_steps, callback.every_n_epochs) == (0, 0)
    _fit(tmp_path, callback, max_epochs=2)
    assert not (tmp_path / "checkpoints").exists()


def test_save_on_exception_also_refreshes_last(tmp_path):
    class Failing(Scored):
        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    callback = ModelCheckpoint(save_on_exception=True, save_last=True, filename="{step}")
    t = quiet_trainer(tmp_path, max_epochs=3, callbacks=[callback], enable_checkpointing=True)
    with pytest.raises(RuntimeError, match="boom"):
        t.fit(Failing(), make_loader(n=8), make_loader(n=8))
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["last", "step=2", "step=3"]
    assert trainer.checkpoint.read_checkpoint(tmp_path / "checkpoints" / "last")["global_step"] == 3


def test_dirpath_is_made_absolute_with_the_home_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ModelCheckpoint(dirpath="~/ckpts").dirpath == str(tmp_path.resolve() / "ckpts")
    monkeypatch.chdir(tmp_path)
    assert ModelCheckpoint(dirpath="rel").dirpath == str(tmp_path.resolve() / "rel")


def test_to_yaml_and_file_exists_as_lightning(tmp_path):
    import yaml

    callback = ModelCheckpoint(monitor="score", mode="min", save_top_k=2)
    run_dir = tmp_path / "run"
    t = quiet_trainer(run_dir, callbacks=[callback], enable_checkpointing=True, max_epochs=3)
    t.fit(Scored(), make_loader(n=8), make_loader(n=8))
    assert all(isinstance(s, torch.Tensor) for s in callback.best_k_models.values())
    assert callback.best_k_models[callback.best_model_path].item() == 0.0  # Lightning's .item()

    callback.to_yaml()
    written = yaml.safe_load((run_dir / "checkpoints" / "best_k_models.yaml").read_text())
    assert written == {path: float(s) for path, s in callback.best_k_models.items()}
    callback.to_yaml(tmp_path / "elsewhere.yaml")
    assert yaml.safe_load((tmp_path / "elsewhere.yaml").read_text()) == written

    assert callback.file_exists(callback.best_model_path, t)
    assert not callback.file_exists(tmp_path / "missing", t)
    with pytest.raises(trainer.ConfigurationError, match="filepath"):
        ModelCheckpoint().to_yaml()  # no dirpath before fit
