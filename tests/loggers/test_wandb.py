"""Tests of trainer/loggers/wandb.py: real offline runs, read back from their ``.wandb`` files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.errors import ConfigurationError
from trainer.loggers.wandb import STEP_METRIC, WandbLogger

wandb = pytest.importorskip("wandb")
from tests.loggers.wandb_reader import find_runs  # noqa: E402


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, quiet, and every file wandb writes (cache, config, staging) under tmp_path."""
    for variable, folder in (
        ("WANDB_DIR", "wandb_dir"),
        ("WANDB_CACHE_DIR", "wandb_cache"),
        ("WANDB_CONFIG_DIR", "wandb_config"),
        ("WANDB_DATA_DIR", "wandb_data"),
    ):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


def history(run: Any) -> list[dict[str, Any]]:
    """History rows without wandb's own bookkeeping keys (``_step``, ``_runtime``, ...)."""
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in run.history]


def test_metrics_config_and_step_axis_read_back(tmp_path: Path) -> None:
    logger = WandbLogger(
        name="first", save_dir=tmp_path / "logs", project="mnist", offline=True, tags=["demo"]
    )
    assert logger.name == "mnist"
    assert logger.save_dir == logger.log_dir == str(tmp_path / "logs")
    logger.log_hyperparams({"lr": 0.1, "layers": (4, 2), "root": Path("/data")})
    logger.log_metrics({"train/loss": torch.tensor(0.5), "epoch": 0.0}, step=10)
    logger.log_metrics({"train/loss": 0.25, "epoch": 0.0}, step=20)
    run_id = logger.version
    logger.finalize("success")

    (run,) = find_runs(tmp_path / "logs")
    assert (run.run_id, run.project, run.display_name, run.tags) == (
        run_id,
        "mnist",
        "first",
        ["demo"],
    )
    assert run.config == {"lr": 0.1, "layers": [4, 2], "root": "/data"}
    assert history(run) == [
        {"train/loss": 0.5, "epoch": 0, STEP_METRIC: 10},
        {"train/loss": 0.25, "epoch": 0, STEP_METRIC: 20},
    ]
    assert run.step_metrics["*"] == STEP_METRIC  # every metric is plotted against the step
    assert run.exit_code == 0


def test_id_is_known_before_the_run_starts_and_resume_continues_it(tmp_path: Path) -> None:
    first = WandbLogger(save_dir=tmp_path, offline=True, prefix="p")
    state = first.state_dict()  # what a checkpoint records, before any write
    assert "wandb" not in os.listdir(tmp_path)
    assert state == {"name": "trainer_logs", "version": first.version, "step": None}
    for step in (0, 1, 2, 3):
        first.log_metrics({"loss": float(step)}, step)
    first.finalize("failed")

    resumed = WandbLogger(save_dir=tmp_path, offline=True, prefix="p")
    resumed.load_state_dict(state)
    resumed.log_metrics({"loss": 10.0}, step=2)  # lower than the last step: kept, no warning
    resumed.log_metrics({"loss": 11.0})  # None: one past the last step
    resumed.finalize("success")

    assert resumed.version == first.version
    runs = find_runs(tmp_path)
    assert [run.run_id for run in runs] == [first.version, first.version]
    assert [run.exit_code for run in runs] == [1, 0]
    assert [row[STEP_METRIC] for row in history(runs[0])] == [0, 1, 2, 3]
    assert history(runs[1]) == [
        {"p-loss": 10.0, STEP_METRIC: 2},
        {"p-loss": 11.0, STEP_METRIC: 3},
    ]


def test_given_id_wins_over_the_checkpoint(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path, offline=True, version="mine0001")
    logger.load_state_dict({"name": "trainer_logs", "version": "other001"})
    logger.log_metrics({"loss": 1.0}, 0)
    logger.finalize("success")
    assert [run.run_id for run in find_runs(tmp_path)] == ["mine0001"]


def fit_with_checkpoints(tmp_path: Path, logger: Any, *, should_fail: bool = False) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_top_k=1)

    class Module(LinearModule):
        def on_train_end(self) -> None:
            if should_fail:
                raise RuntimeError("boom")

    trainer = quiet_trainer(
        tmp_path,
        max_epochs=2,
        logger=logger,
        enable_checkpointing=True,
        callbacks=[checkpoint],  # ModelCheckpoint calls after_save_checkpoint itself
    )
    if should_fail:
        with pytest.raises(RuntimeError, match="boom"):
            trainer.fit(Module(), make_loader(), make_loader(n=8))
    else:
        trainer.fit(Module(), make_loader(), make_loader(n=8))


def test_log_model_all_uploads_each_checkpoint_as_it_is_saved(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path, offline=True, log_model="all")
    fit_with_checkpoints(tmp_path, logger)

    (run,) = find_runs(tmp_path)
    names = [artifact["metadata"]["original_filename"] for artifact in run.artifacts]
    assert names == ["epoch=0-step=8", "epoch=1-step=16"]
    for artifact in run.artifacts:
        assert (artifact["name"], artifact["type"]) == (f"model-{run.run_id}", "model")
        assert {"manifest.json", "model.safetensors"} <= set(artifact["files"])
        assert artifact["aliases"] == ["latest", "best"] or artifact["aliases"] == [
            "best",
            "latest",
        ]
        assert artifact["metadata"]["ModelCheckpoint"]["monitor"] == "val/loss"


def test_log_model_true_uploads_the_kept_checkpoints_at_success_only(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path / "ok", offline=True, log_model=True)
    fit_with_checkpoints(tmp_path / "ok", logger)
    (run,) = find_runs(tmp_path / "ok")
    assert [a["metadata"]["original_filename"] for a in run.artifacts] == ["epoch=1-step=16"]
    assert run.artifacts[0]["metadata"]["score"] > 0

    failing = WandbLogger(save_dir=tmp_path / "failed", offline=True, log_model=True)
    fit_with_checkpoints(tmp_path / "failed", failing, should_fail=True)
    (run,) = find_runs(tmp_path / "failed")
    assert run.artifacts == [] and run.exit_code == 1


def test_an_active_run_is_used_and_left_open(tmp_path: Path) -> None:
    user_run = wandb.init(project="mine", dir=str(tmp_path), mode="offline")
    try:
        logger = WandbLogger(save_dir=tmp_path, offline=True)
        with pytest.warns(UserWarning, match="already active"):
            logger.log_metrics({"loss": 1.0}, step=3)
        assert logger.version == user_run.id
        logger.finalize("success")
        assert wandb.run is user_run  # the user's run is the user's to finish
    finally:
        wandb.finish()
    (run,) = find_runs(tmp_path)
    assert history(run) == [{"loss": 1.0, STEP_METRIC: 3}]


def test_a_given_experiment_is_logged_to_and_left_open(tmp_path: Path) -> None:
    user_run = wandb.init(project="mine", dir=str(tmp_path), mode="offline")
    try:
        logger = WandbLogger(save_dir=tmp_path / "unused", experiment=user_run)
        trainer = quiet_trainer(tmp_path, logger=logger, max_epochs=1, log_every_n_steps=4)
        trainer.fit(LinearModule(), make_loader())
        assert logger.version == user_run.id
        assert wandb.run is user_run  # not finished by the logger
    finally:
        wandb.finish()
    (run,) = find_runs(tmp_path)
    assert [row[STEP_METRIC] for row in history(run) if "train/loss" in row] == [3, 7]
    assert not (tmp_path / "unused").exists()  # no second run was started


def test_immutable_add_file_policy_uploads_the_same_checkpoint_files(tmp_path: Path) -> None:
    logger = WandbLogger(
        save_dir=tmp_path, offline=True, log_model="all", add_file_policy="immutable"
    )
    fit_with_checkpoints(tmp_path, logger)
    (run,) = find_runs(tmp_path)
    assert len(run.artifacts) == 2
    for artifact in run.artifacts:
        assert {"manifest.json", "model.safetensors"} <= set(artifact["files"])


def test_bad_arguments_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"add_file_policy='copy'.*'mutable'"):
        WandbLogger(add_file_policy="copy")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"log_model.*True, False or 'all'"):
        WandbLogger(log_model="best")
    with pytest.raises(ConfigurationError, match=r"id \(or version\)"):
        WandbLogger(id="")
    with pytest.raises(ConfigurationError, match="argparse.Namespace"):
        WandbLogger(save_dir=tmp_path, offline=True).log_hyperparams([1])  # type: ignore[arg-type]
    logger = WandbLogger(save_dir=tmp_path, offline=True)
    with pytest.raises(ConfigurationError, match="step to be an int"):
        logger.log_metrics({"loss": 1.0}, step="3")  # type: ignore[arg-type]
    assert not (tmp_path / "wandb").exists()  # rejected before any run started
