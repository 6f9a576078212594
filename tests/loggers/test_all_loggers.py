"""All four loggers at once: one fit writes the same stream to each, read back from its files.

Also the resume contract (a fit resumed from a checkpoint continues the same CSV version,
TensorBoard version, wandb run and MLflow run, with no repeated or decreasing step), the
Accelerator's ``log_with`` names, and the MissingDependencyError of each backend.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer import Accelerator, ConfigurationError, LoggerType
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from trainer.loggers.wandb import STEP_METRIC

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)

from tests.loggers.wandb_reader import find_runs

REPO_ROOT = Path(__file__).resolve().parents[2]
Point = tuple[str, int, float]  # metric name, step, value


@pytest.fixture(autouse=True)
def isolated_trackers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb offline and quiet with its files under tmp_path; MLflow's env var restored after."""
    for variable, folder in (
        ("WANDB_DIR", "wandb_dir"),
        ("WANDB_CACHE_DIR", "wandb_cache"),
        ("WANDB_CONFIG_DIR", "wandb_config"),
        ("WANDB_DATA_DIR", "wandb_data"),
    ):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for variable in ("WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(variable, raising=False)


def make_loggers(root: Path) -> list[Logger]:
    """The four loggers, each in its own folder; MLflow in its default folder store."""
    return [
        CSVLogger(root / "csv", name="exp"),
        TensorBoardLogger(root / "tb", name="exp", default_hp_metric=False),
        WandbLogger(project="exp", save_dir=root / "wandb", offline=True),
        MLFlowLogger(experiment_name="exp", save_dir=root / "mlruns"),
    ]


# ---- reading each backend's files ----------------------------------------------------------------
def csv_points(logger: CSVLogger) -> list[Point]:
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return [
        (key, int(row["step"]), float(value))
        for row in rows
        for key, value in row.items()
        if key != "step" and value != ""
    ]


def csv_rows(logger: CSVLogger) -> list[dict[str, str]]:
    """metrics.csv's rows, without their empty cells."""
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="", encoding="utf-8") as file:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(file)]


def tensorboard_points(logger: TensorBoardLogger) -> list[Point]:
    """Points in the order they were written (wall time), after TensorBoard's purges."""
    accumulator = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    events = [
        (event.wall_time, tag, event.step, event.value)
        for tag in accumulator.Tags()["scalars"]
        for event in accumulator.Scalars(tag)
    ]
    return [(tag, step, value) for _, tag, step, value in sorted(events, key=lambda e: e[0])]


def wandb_points(logger: WandbLogger) -> list[Point]:
    points = []
    for run in find_runs(logger.save_dir):
        assert run.run_id == logger.version
        for row in run.history:
            step = row[STEP_METRIC]
            points.extend(
                (key, step, float(value))
                for key, value in row.items()
                if not key.startswith("_") and key != STEP_METRIC
            )
    return points


def mlflow_points(logger: MLFlowLogger) -> list[Point]:
    """Every stored point, by timestamp (MLflow keeps one copy of identical points)."""
    client = MlflowClient(logger.tracking_uri)
    points = []
    for key in client.get_run(logger.run_id).data.metrics:
        points.extend(
            (metric.timestamp, key, metric.step, metric.value)
            for metric in client.get_metric_history(logger.run_id, key)
        )
    return [(key, step, value) for _, key, step, value in sorted(points, key=lambda p: p[0])]


def read_all(loggers: list[Any]) -> dict[str, list[Point]]:
    csv_logger, tb_logger, wandb_logger, mlflow_logger = loggers
    return {
        "csv": csv_points(csv_logger),
        "tensorboard": tensorboard_points(tb_logger),
        "wandb": wandb_points(wandb_logger),
        "mlflow": mlflow_points(mlflow_logger),
    }


def assert_same_points(expected: list[Point], received: list[Point], name: str) -> None:
    """Same names and steps, values within 1e-6 (TensorBoard stores float32)."""
    expected, received = sorted(expected), sorted(received)
    assert [(k, s) for k, s, _ in received] == [(k, s) for k, s, _ in expected], name
    for (key, step, want), (_, _, got) in zip(expected, received):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6), (name, key, step)


# ---- one fit, four loggers -----------------------------------------------------------------------
def test_one_fit_writes_the_same_stream_to_every_logger(tmp_path: Path) -> None:
    loggers = make_loggers(tmp_path)
    trainer = quiet_trainer(tmp_path, max_epochs=2, log_every_n_steps=2, logger=loggers)
    trainer.fit(LinearModule(), make_loader(), make_loader(n=8))

    points = read_all(loggers)
    reference = points["csv"]
    assert {key for key, _, _ in reference} == {"train/loss", "val/loss", "epoch"}
    # Lightning's steps: every 2nd optimizer step, at the steps done before it (1, 3, ...);
    # validation at the step of the epoch's last batch
    assert sorted({s for k, s, _ in reference if k == "train/loss"}) == list(range(1, 16, 2))
    assert sorted(s for k, s, _ in reference if k == "val/loss") == [7, 15]
    assert_same_points(reference, points["tensorboard"], "tensorboard")
    assert_same_points(reference, points["wandb"], "wandb")
    # MLflow stores identical (name, step, value, millisecond) points once: compare as sets.
    assert_same_points(sorted(set(reference)), sorted(set(points["mlflow"])), "mlflow")

    assert trainer.log_dir == loggers[0].log_dir
    assert MlflowClient(loggers[3].tracking_uri).get_run(loggers[3].run_id).data.params == {
        "lr": "0.05"
    }
    (run,) = find_runs(loggers[2].save_dir)
    assert run.config == {"lr": 0.05}


def test_resumed_fit_continues_every_run_without_repeated_steps(tmp_path: Path) -> None:
    first = make_loggers(tmp_path)
    trainer = quiet_trainer(tmp_path, max_epochs=1, log_every_n_steps=2, logger=first)
    trainer.fit(LinearModule(), make_loader(), make_loader(n=8))
    trainer.save_checkpoint(tmp_path / "ckpt")
    identities = [(logger.name, logger.version) for logger in first]

    resumed = make_loggers(tmp_path)  # fresh objects, no version or id given
    trainer = quiet_trainer(tmp_path, max_epochs=2, log_every_n_steps=2, logger=resumed)
    trainer.fit(LinearModule(), make_loader(), make_loader(n=8), ckpt_path=tmp_path / "ckpt")

    assert [(logger.name, logger.version) for logger in resumed] == identities
    assert os.listdir(tmp_path / "csv" / "exp") == ["version_0"]
    assert os.listdir(tmp_path / "tb" / "exp") == ["version_0"]
    experiment = MlflowClient(resumed[3].tracking_uri).get_experiment_by_name("exp")
    runs = MlflowClient(resumed[3].tracking_uri).search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [resumed[3].version]
    assert [run.run_id for run in find_runs(resumed[2].save_dir)] == [resumed[2].version] * 2

    for name, points in read_all(resumed).items():
        steps = [step for key, step, _ in points if key == "train/loss"]
        assert steps == list(range(1, 16, 2)), name  # in write order: no repeat, no decrease
        assert [step for key, step, _ in points if key == "val/loss"] == [7, 15], name


def test_resuming_an_earlier_checkpoint_drops_later_points_in_the_file_loggers(
    tmp_path: Path,
) -> None:
    """As after a crash: the run went on past the checkpoint it resumes from.

    CSV and TensorBoard replace the points from the first step logged again; W&B and MLflow
    histories are append-only, so there those steps appear twice (see docs/loggers.md).
    """
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    first = [CSVLogger(tmp_path / "csv"), TensorBoardLogger(tmp_path / "tb")]
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=2,
        log_every_n_steps=2,
        logger=first,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    trainer.fit(LinearModule(), make_loader(), make_loader(n=8))
    time.sleep(1.01 - time.time() % 1)  # event files are named by the second they are opened in

    resumed = [CSVLogger(tmp_path / "csv"), TensorBoardLogger(tmp_path / "tb")]
    trainer = quiet_trainer(tmp_path, max_epochs=2, log_every_n_steps=2, logger=resumed)
    trainer.fit(
        LinearModule(),
        make_loader(),
        make_loader(n=8),
        ckpt_path=tmp_path / "ckpt" / "epoch=0-step=8",
    )

    for points in (csv_points(resumed[0]), tensorboard_points(resumed[1])):
        steps = [step for key, step, _ in points if key == "train/loss"]
        assert steps == list(range(1, 16, 2))
        assert [step for key, step, _ in points if key == "val/loss"] == [7, 15]


# ---- the Accelerator's trackers ------------------------------------------------------------------
def test_every_logger_checks_the_step_and_continues_one_past_the_last(tmp_path: Path) -> None:
    """A step-less row lands one past the last step in all four; a non-int step is refused by
    each, naming the logger, before anything is written for it."""
    loggers = make_loggers(tmp_path)
    for logger in loggers:
        for bad in ("3", 2.5, True, [1]):
            with pytest.raises(ConfigurationError, match=f"{type(logger).__name__}.log_metrics"):
                logger.log_metrics({"a": 0.0}, step=bad)  # type: ignore[arg-type]
        logger.log_metrics({"a": 1.0})  # no row yet: step 0
        logger.log_metrics({"a": 2.0}, step=torch.tensor(4))  # a 0-d int tensor is an index
        logger.log_metrics({"a": 3.0})  # one past the last: 5
        logger.finalize("success")
    expected = [("a", 0, 1.0), ("a", 4, 2.0), ("a", 5, 3.0)]
    for name, points in read_all(loggers).items():
        assert_same_points(expected, points, name)


def test_accelerator_log_with_names_build_the_same_loggers(tmp_path: Path) -> None:
    accelerator = Accelerator(
        cpu=True,
        log_with=[LoggerType.TENSORBOARD, "wandb", "mlflow"],
        project_dir=str(tmp_path),
    )
    accelerator.init_trackers(
        "proj",
        config={"lr": 0.1},
        init_kwargs={"wandb": {"offline": True, "name": "first"}, "mlflow": {"run_name": "r"}},
    )
    tensorboard, wandb_logger, mlflow = accelerator.trackers
    assert isinstance(tensorboard, TensorBoardLogger) and tensorboard.name == "proj"
    assert accelerator.get_tracker("wandb") is wandb_logger
    assert accelerator.get_tracker("mlflow") is mlflow
    assert accelerator.get_tracker("wandb", unwrap=True) is wandb_logger.experiment
    for step in (1, 2):
        accelerator.log({"loss": 1.0 / step}, step=step)
    accelerator.end_training()

    assert tensorboard.log_dir == str(tmp_path / "proj" / "version_0")
    assert tensorboard_points(tensorboard) == [("loss", 1, 1.0), ("loss", 2, 0.5)]
    (run,) = find_runs(tmp_path)
    assert (run.project, run.display_name, run.config) == ("proj", "first", {"lr": 0.1})
    assert wandb_points(wandb_logger) == [("loss", 1, 1.0), ("loss", 2, 0.5)]
    assert mlflow.save_dir == str(tmp_path / "mlruns")
    assert mlflow_points(mlflow) == [("loss", 1, 1.0), ("loss", 2, 0.5)]
    record = MlflowClient(mlflow.tracking_uri).get_run(mlflow.run_id)
    assert (record.info.run_name, record.info.status, record.data.params) == (
        "r",
        "FINISHED",
        {"lr": "0.1"},
    )


def test_log_with_all_builds_every_installed_tracker(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True, log_with=LoggerType.ALL, project_dir=str(tmp_path))
    accelerator.init_trackers("proj", init_kwargs={"wandb": {"offline": True}})
    assert [tracker.tracker_name for tracker in accelerator.trackers] == [
        "csv",
        "tensorboard",
        "wandb",
        "mlflow",
    ]
    assert accelerator.get_tracker("csv") is accelerator.trackers[0]
    accelerator.end_training()  # nothing was logged: no run is started or left open


# ---- a missing package ---------------------------------------------------------------------------
def test_missing_package_names_the_pip_extra() -> None:
    """Each backend, hidden from the import system, fails at construction with the fix."""
    script = textwrap.dedent(
        """
        import sys
        for name in ("tensorboard", "wandb", "mlflow"):
            sys.modules[name] = None  # makes `import name` raise ImportError
        from trainer import Accelerator
        from trainer.errors import MissingDependencyError
        from trainer.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

        attempts = {
            "tensorboard": lambda: TensorBoardLogger("logs"),
            "wandb": lambda: WandbLogger(offline=True),
            "mlflow": lambda: MLFlowLogger(),
            "log_with": lambda: Accelerator(cpu=True, log_with="wandb").init_trackers("p"),
        }
        for label, attempt in attempts.items():
            try:
                attempt()
            except MissingDependencyError as err:
                print(label, "|", err)
            else:
                print(label, "| no error")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" | ", 1) for line in done.stdout.strip().splitlines())
    assert "TensorBoardLogger needs the package 'tensorboard'" in lines["tensorboard"]
    assert "pip install 'trainer[tensorboard]'" in lines["tensorboard"]
    assert "WandbLogger needs the package 'wandb'" in lines["wandb"]
    assert "pip install 'trainer[wandb]'" in lines["wandb"]
    assert "MLFlowLogger needs the package 'mlflow'" in lines["mlflow"]
    assert "pip install 'trainer[mlflow]'" in lines["mlflow"]
    assert "pip install 'trainer[wandb]'" in lines["log_with"]


# ---- Accelerate-style log with values that are not numbers ---------------------------------------
_MIXED = {"loss": torch.tensor(0.5), "note": "hello", "group": {"a": 1.0, "b": 2.0}}


def _tensorboard_contents(log_dir: Path) -> dict[str, Any]:
    """Scalar and text tags, with steps and values, of every run under ``log_dir``."""
    found: dict[str, Any] = {}
    for folder in sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        accumulator.Reload()
        run = folder.relative_to(log_dir).as_posix()
        for tag in accumulator.Tags()["scalars"]:
            found[f"{run}:{tag}"] = [(e.step, e.value) for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["tensors"]:
            found[f"{run}:{tag}"] = [
                (e.step, e.tensor_proto.string_val[0].decode()) for e in accumulator.Tensors(tag)
            ]
    return found


def test_accelerate_style_log_writes_text_and_scalar_groups_as_accelerate(tmp_path: Path) -> None:
    """A str goes to TensorBoard as text and a dict as sub-runs, as Accelerate's TensorBoard
    tracker writes them (read back from both); W&B stores every value; CSV writes text cells and
    ``group/a`` columns; MLflow keeps the numbers and warns naming what it drops. It raised
    ConfigurationError on the main process."""
    accelerate = pytest.importorskip("accelerate")

    theirs = accelerate.Accelerator(
        cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "accelerate")
    )
    theirs.init_trackers("proj")
    theirs.log(dict(_MIXED), step=3)
    theirs.end_training()
    accelerator = Accelerator(
        cpu=True, log_with=["tensorboard", "wandb", "mlflow", "csv"], project_dir=str(tmp_path)
    )
    accelerator.init_trackers("proj", init_kwargs={"wandb": {"offline": True}})
    with pytest.warns(UserWarning, match="MLFlowLogger.log: ") as caught:
        accelerator.log(_MIXED, step=3)
    tensorboard, _, mlflow, csv_logger = accelerator.trackers
    accelerator.end_training()

    expected = _tensorboard_contents(tmp_path / "accelerate" / "proj")
    received = _tensorboard_contents(Path(tensorboard.log_dir))
    assert {k.split(":", 1)[1] for k in received} == {"loss", "note/text_summary", "group"}
    normalised = {  # Accelerate's run folder is a timestamp; ours is version_0
        (k.split(":")[0].split("/")[-1] if "group" in k else "") + ":" + k.split(":")[1]: v
        for k, v in received.items()
    }
    assert normalised == {
        (k.split(":")[0].split("/")[-1] if "group" in k else "") + ":" + k.split(":")[1]: v
        for k, v in expected.items()
    }
    (run,) = find_runs(tmp_path)
    (row,) = run.history  # the reader shows a nested dict's keys as "group/a"
    assert (row["loss"], row["note"], row["group/a"], row["group/b"], row[STEP_METRIC]) == (
        0.5,
        "hello",
        1,
        2,
        3,
    )
    assert mlflow_points(mlflow) == [("loss", 3, 0.5)]
    assert csv_rows(csv_logger) == [
        {"step": "3", "loss": "0.5", "note": "hello", "group/a": "1.0", "group/b": "2.0"}
    ]
    dropped = sorted(str(w.message).split(".log:")[0] for w in caught if ".log:" in str(w.message))
    assert dropped == ["MLFlowLogger"] * 2


def test_accelerate_style_log_stores_or_warns_for_every_value_type(tmp_path: Path) -> None:
    """None, a list, a larger tensor, a bool, a numpy float32 and a dict with a str member:
    no tracker raises (on the main process only, a hang in a multi-process run). Each keeps
    what its Accelerate tracker keeps and warns naming the rest; TensorBoard used to raise
    ConfigurationError on the str member, and CSV dropped the whole dict."""
    accelerator = Accelerator(
        cpu=True, log_with=["tensorboard", "wandb", "mlflow", "csv"], project_dir=str(tmp_path)
    )
    accelerator.init_trackers("proj", init_kwargs={"wandb": {"offline": True}})
    values = {
        "none": None,
        "items": [1, 2],
        "vector": torch.tensor([1.0, 2.0]),
        "flag": True,
        "half": np.float32(0.5),
        "group": {"a": 1.0, "s": "x"},
    }
    with pytest.warns(UserWarning) as caught:
        accelerator.log(values, step=2)
    tensorboard, _, mlflow, csv_logger = accelerator.trackers
    accelerator.end_training()

    dropped = sorted(
        (message.split(".log:")[0], message.split("'")[1])
        for message in (str(w.message) for w in caught)
        if ".log:" in message
    )
    by_tracker = {"MLFlowLogger": [], "TensorBoardLogger": [], "CSVLogger": []}
    for owner, key in dropped:
        by_tracker[owner].append(key)
    assert by_tracker == {
        "MLFlowLogger": ["group", "items", "none", "vector"],
        "TensorBoardLogger": ["group/s", "items", "none", "vector"],
        "CSVLogger": ["items", "none", "vector"],
    }
    received = _tensorboard_contents(Path(tensorboard.log_dir))
    assert received == {".:flag": [(2, 1.0)], ".:half": [(2, 0.5)], "group_a:group": [(2, 1.0)]}
    assert sorted(mlflow_points(mlflow)) == [("flag", 2, 1.0), ("half", 2, 0.5)]
    assert csv_rows(csv_logger) == [
        {"step": "2", "flag": "1.0", "half": "0.5", "group/a": "1.0", "group/s": "x"}
    ]
    (run,) = find_runs(tmp_path)
    (row,) = run.history  # wandb's own JSON: a tensor as a list, None as null
    assert {k: v for k, v in row.items() if not k.startswith("_")} == {
        "none": None,
        "items": [1, 2],
        "vector": [1, 2],
        "flag": True,
        "half": 0.5,
        "group/a": 1,
        "group/s": "x",
        STEP_METRIC: 2,
    }


def test_log_kwargs_reach_each_named_tracker_as_in_accelerate(tmp_path: Path) -> None:
    """``accelerator.log(..., log_kwargs={tracker: {...}})`` was ignored: TensorBoard's events got
    the current wall time instead of the ``walltime`` given, and W&B's ``commit=False`` (the next
    call adds to the same row) made two rows. Compared with Accelerate's TensorBoard tracker."""
    accelerate = pytest.importorskip("accelerate")
    kwargs = {"tensorboard": {"walltime": 1_000_000.0}, "wandb": {"commit": False}}

    def walltimes(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
        (folder,) = sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")})
        accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        accumulator.Reload()
        return {
            tag: [(e.step, e.wall_time) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]
        }

    theirs = accelerate.Accelerator(
        cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "accelerate")
    )
    theirs.init_trackers("proj")
    theirs.log({"loss": 0.5}, step=3, log_kwargs={"tensorboard": kwargs["tensorboard"]})
    theirs.end_training()
    accelerator = Accelerator(
        cpu=True, log_with=["tensorboard", "wandb", "mlflow", "csv"], project_dir=str(tmp_path)
    )
    accelerator.init_trackers("proj", init_kwargs={"wandb": {"offline": True}})
    accelerator.log({"loss": 0.5}, step=3, log_kwargs=kwargs)  # mlflow, csv: none given
    accelerator.log({"acc": 0.9}, step=3)
    tensorboard, _, mlflow, csv_logger = accelerator.trackers
    accelerator.end_training()

    ours = walltimes(Path(tensorboard.log_dir))
    assert ours["loss"] == walltimes(tmp_path / "accelerate" / "proj")["loss"] == [(3, 1e6)]
    assert ours["acc"][0][1] > 1.7e9  # no walltime given: now
    (run,) = find_runs(tmp_path)
    (row,) = run.history  # commit=False: the second call completed the same row
    assert (row["loss"], row["acc"], row[STEP_METRIC]) == (0.5, 0.9, 3)
    assert sorted(mlflow_points(mlflow)) == [("acc", 3, 0.9), ("loss", 3, 0.5)]
    assert [{k: v for k, v in row.items() if v} for row in csv_rows(csv_logger)] == [
        {"step": "3", "loss": "0.5"},
        {"step": "3", "acc": "0.9"},
    ]  # a row per call, as before
