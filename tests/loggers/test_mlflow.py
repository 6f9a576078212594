"""Tests of trainer/loggers/mlflow.py: real runs in a sqlite store, read back with MlflowClient."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.errors import ConfigurationError
from trainer.loggers.mlflow import MLFlowLogger

pytest.importorskip("mlflow")
pytest.importorskip("sqlalchemy")
from mlflow.tracking import MlflowClient


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One sqlite database for the module: creating its schema takes ~2 s."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # run the schema migrations once
    return {"tracking_uri": uri, "artifact_location": str(root / "artifacts")}


def make_logger(store: dict[str, str], **kwargs: object) -> MLFlowLogger:
    return MLFlowLogger(**{**store, **kwargs})  # type: ignore[arg-type]


def history(logger: MLFlowLogger, key: str) -> list[tuple[int, float]]:
    metrics = MlflowClient(logger.tracking_uri).get_metric_history(logger.run_id, key)
    return sorted((metric.step, metric.value) for metric in metrics)


def test_metrics_params_tags_and_status_read_back(store: dict[str, str]) -> None:
    logger = make_logger(store, experiment_name="read_back", run_name="first", tags={"team": 7})
    logger.log_hyperparams(
        argparse.Namespace(lr=0.1, optimizer={"name": "sgd", "momentum": 0.9}, note="x" * 7000)
    )
    for step in range(0, 50, 10):
        logger.log_metrics(
            {"train/loss": torch.tensor(1.0 / (step + 1), dtype=torch.float64), "epoch": 0.0}, step
        )
    logger.finalize("success")

    client = MlflowClient(store["tracking_uri"])
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "first"
    assert run.data.tags["team"] == "7"
    assert client.get_experiment(run.info.experiment_id).name == "read_back"
    assert logger.name == "read_back" and logger.version == logger.run_id
    params = run.data.params
    assert {k: params[k] for k in ("lr", "optimizer/name", "optimizer/momentum")} == {
        "lr": "0.1",
        "optimizer/name": "sgd",
        "optimizer/momentum": "0.9",
    }
    assert params["note"] == "x" * 6000  # MLflow's limit
    assert history(logger, "train/loss") == [(s, 1.0 / (s + 1)) for s in range(0, 50, 10)]
    assert history(logger, "epoch") == [(s, 0.0) for s in range(0, 50, 10)]


@pytest.mark.parametrize(("status", "expected"), [("failed", "FAILED"), ("interrupted", "KILLED")])
def test_finalize_sets_the_run_status(store: dict[str, str], status: str, expected: str) -> None:
    logger = make_logger(store, experiment_name="statuses")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize(status)
    assert MlflowClient(store["tracking_uri"]).get_run(logger.run_id).info.status == expected


def test_metrics_wait_in_memory_until_due(store: dict[str, str]) -> None:
    buffered = make_logger(store, experiment_name="buffer", flush_interval_s=3600)
    buffered.log_hyperparams({"lr": 0.1})  # starts the run
    buffered.log_metrics({"loss": 1.0}, step=1)
    buffered.log_metrics({"loss": 0.5})  # step None: one past the last
    assert history(buffered, "loss") == []
    buffered.save()
    assert history(buffered, "loss") == [(1, 1.0), (2, 0.5)]

    immediate = make_logger(store, experiment_name="buffer", flush_interval_s=0)
    immediate.log_metrics({"loss": 3.0}, step=4)
    assert history(immediate, "loss") == [(4, 3.0)]
    for logger in (buffered, immediate):
        logger.finalize("success")


def test_asynchronous_writes_are_complete_at_each_checkpoint_and_at_the_end(
    store: dict[str, str],
) -> None:
    """Lightning's ``synchronous=False``: MLflow writes on its own thread; a checkpoint's state
    and finalize wait for every queued point."""
    logger = make_logger(store, experiment_name="async", flush_interval_s=0, synchronous=False)
    for step in range(50):
        logger.log_metrics({"loss": float(step)}, step=step)  # each one its own log_batch
    assert logger._operations  # MLflow handed back handles: the writes run on its thread
    state = logger.state_dict()  # what a checkpoint saves: every point before it is stored
    assert logger._operations == []
    assert history(logger, "loss") == [(step, float(step)) for step in range(50)]
    assert state["step"] == 49
    logger.log_metrics({"loss": 99.0}, step=50)
    logger.finalize("success")
    assert history(logger, "loss")[-1] == (50, 99.0)
    run = MlflowClient(store["tracking_uri"]).get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    with pytest.raises(ConfigurationError, match=r"synchronous='no'"):
        make_logger(store, synchronous="no")


def test_run_id_reopens_the_run_and_keeps_first_param_values(store: dict[str, str]) -> None:
    first = make_logger(store, experiment_name="reopen")
    first.log_hyperparams({"lr": 0.1})
    first.log_metrics({"loss": 1.0}, step=5)
    first.finalize("failed")

    again = make_logger(store, experiment_name="ignored", run_id=first.run_id)
    with pytest.warns(UserWarning, match=r"\['lr'\].*cannot change"):
        again.log_hyperparams({"lr": 0.2, "batch_size": 8})
    assert MlflowClient(store["tracking_uri"]).get_run(first.run_id).info.status == "RUNNING"
    again.log_metrics({"loss": 0.5}, step=6)
    again.finalize("success")

    run = MlflowClient(store["tracking_uri"]).get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "batch_size": "8"}
    assert history(again, "loss") == [(5, 1.0), (6, 0.5)]
    assert again.name == "ignored" and again.experiment_id == first.experiment_id


def test_checkpoint_state_starts_nothing_and_resumes_the_run(store: dict[str, str]) -> None:
    logger = make_logger(store, experiment_name="state")
    assert logger.state_dict() == {"name": "state", "version": None, "step": None}  # no run yet
    assert logger._client is None
    logger.log_metrics({"loss": 1.0}, step=1)
    logger.save()
    state = logger.state_dict()
    logger.finalize("failed")

    resumed = make_logger(store, experiment_name="state")
    resumed.load_state_dict(state)
    resumed.log_metrics({"loss": 0.5}, step=2)
    resumed.finalize("success")
    assert resumed.run_id == state["version"]
    assert history(resumed, "loss") == [(1, 1.0), (2, 0.5)]

    gone = make_logger(store, experiment_name="state")
    gone.load_state_dict({"name": "state", "version": "0" * 32})
    with pytest.warns(UserWarning, match="starting a new run"):
        assert gone.run_id != "0" * 32
    gone.finalize("success")
    with pytest.raises(ConfigurationError, match="no such run"):
        _ = make_logger(store, run_id="1" * 32).run_id


def test_log_model_uploads_checkpoint_folders(store: dict[str, str], tmp_path: Path) -> None:
    logger = make_logger(store, experiment_name="models", log_model="all")
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_top_k=1)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=2,
        logger=logger,
        enable_checkpointing=True,
        callbacks=[checkpoint],  # ModelCheckpoint calls after_save_checkpoint itself
    )
    trainer.fit(LinearModule(), make_loader(), make_loader(n=8))

    client = MlflowClient(store["tracking_uri"])
    folders = [entry.path for entry in client.list_artifacts(logger.run_id, "checkpoints")]
    assert folders == ["checkpoints/epoch=0-step=8", "checkpoints/epoch=1-step=16"]
    files = {Path(e.path).name for e in client.list_artifacts(logger.run_id, folders[1])}
    assert {"manifest.json", "model.safetensors"} <= files
    assert history(logger, "val/loss")[-1][0] == 15  # the step of the last batch's row


def test_names_mlflow_rejects_lose_those_characters(store: dict[str, str]) -> None:
    logger = make_logger(store, experiment_name="names", prefix="k", flush_interval_s=0)
    with pytest.warns(UserWarning, match=r"'k-acc@1'.*'k-acc1'"):
        logger.log_metrics({"acc@1": 0.5}, step=0)
    logger.finalize("success")
    assert history(logger, "k-acc1") == [(0, 0.5)]


def test_folder_store_allows_mlflow_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = MLFlowLogger(save_dir=tmp_path / "mlruns")
    assert os.environ.get("MLFLOW_ALLOW_FILE_STORE") is None  # only set when the store opens
    assert logger.save_dir == logger.log_dir == str(tmp_path / "mlruns")
    logger.log_metrics({"loss": 1.0}, step=3)
    logger.finalize("success")
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert (tmp_path / "mlruns" / logger.experiment_id / logger.run_id).is_dir()
    assert history(logger, "loss") == [(3, 1.0)]


def test_database_store_leaves_the_environment_alone(
    store: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    logger = make_logger(store, experiment_name="env")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    assert logger.save_dir is None


def test_deleted_experiment_and_bad_arguments_name_the_fix(store: dict[str, str]) -> None:
    client = MlflowClient(store["tracking_uri"])
    client.delete_experiment(client.create_experiment("deleted"))
    with pytest.raises(ConfigurationError, match="deleted.*Restore it"):
        _ = make_logger(store, experiment_name="deleted").run_id
    with pytest.raises(ConfigurationError, match=r"log_model.*True, False or 'all'"):
        MLFlowLogger(log_model="best")
    with pytest.raises(ConfigurationError, match="experiment_name"):
        MLFlowLogger(experiment_name="")
    with pytest.raises(ConfigurationError, match="flush_interval_s"):
        MLFlowLogger(flush_interval_s=-1)
    logger = make_logger(store, experiment_name="bad")
    with pytest.raises(ConfigurationError, match=r"metric 'loss'.*loss.item\(\)"):
        logger.log_metrics({"loss": [1.0]}, step=0)
    with pytest.raises(ConfigurationError, match="step to be an int"):
        logger.log_metrics({"loss": 1.0}, step=2.5)  # type: ignore[arg-type]


def test_queued_metrics_are_written_when_the_interpreter_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    script = (
        "import sys\n"
        "from trainer.loggers import MLFlowLogger\n"
        "logger = MLFlowLogger(save_dir=sys.argv[1])\n"
        "logger.log_metrics({'loss': 0.5}, step=3)  # queued; no save() or finalize()\n"
        "print(logger.run_id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "mlruns")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().splitlines()[-1]
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(3, 0.5)]
    assert client.get_run(run_id).info.status == "RUNNING"  # never finalized
