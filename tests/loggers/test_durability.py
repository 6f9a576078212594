"""No logger drops a run: working-directory changes, ``kill -9`` and crafted checkpoint states.

Every test reads back the real files (metrics.csv, TensorBoard event files, the MLflow store,
wandb's offline ``.wandb`` files). See docs/logging.md, "When a run is killed", for the
contract these tests pin per logger.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LinearModule, make_loader, quiet_trainer
from tests.loggers.test_all_loggers import (  # noqa: F401  (isolated_trackers is a fixture)
    REPO_ROOT,
    isolated_trackers,
    mlflow_points,
    tensorboard_points,
)
from tests.loggers.wandb_reader import read_run
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.errors import CheckpointError
from trainer.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from trainer.loggers.wandb import STEP_METRIC

Point = tuple[str, int, float]
KINDS = ("csv", "tensorboard", "mlflow", "wandb")


def build_logger(kind: str, root: str | Path, **kwargs: Any) -> Logger:
    """One logger writing under ``root`` (relative paths stay relative: the logger resolves them)."""
    root = os.fspath(root)
    if kind == "csv":
        return CSVLogger(os.path.join(root, "csv"), name="exp", **kwargs)
    if kind == "tensorboard":
        return TensorBoardLogger(os.path.join(root, "tb"), name="exp", **kwargs)
    if kind == "mlflow":
        return MLFlowLogger("exp", tracking_uri=os.path.join(root, "mlruns"), **kwargs)
    if kind == "wandb":
        return WandbLogger(project="exp", save_dir=os.path.join(root, "wandb"), offline=True)
    raise ValueError(kind)


def wandb_runs(save_dir: str | Path, *, finished: int, wait_s: float = 15.0) -> list[Any]:
    """Every offline run under ``save_dir``, oldest first, once ``finished`` have an exit record.

    A killed run never gets one (unlike tests.loggers.wandb_reader.find_runs, which waits for
    every run to finish).
    """
    deadline = time.monotonic() + wait_s
    while True:
        paths = sorted(
            Path(save_dir).rglob("offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime_ns
        )
        runs = [read_run(path) for path in paths]
        done = sum(run.exit_code is not None for run in runs)
        if done >= finished or time.monotonic() > deadline:
            return runs
        time.sleep(0.05)


def csv_file_points(log_dir: str | Path) -> list[Point]:
    path = Path(log_dir) / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return [
        (key, int(row["step"]), float(value))
        for row in rows
        for key, value in row.items()
        if key != "step" and value != ""
    ]


def wandb_run_points(run: Any) -> list[Point]:
    return [
        (key, int(row[STEP_METRIC]), float(value))
        for row in run.history
        for key, value in row.items()
        if not key.startswith("_") and key != STEP_METRIC
    ]


def points_of(kind: str, logger: Any) -> list[Point]:
    """What ``logger``'s files hold (every wandb run folder of its id, in order)."""
    if kind == "csv":
        return csv_file_points(logger.log_dir)
    if kind == "tensorboard":
        return tensorboard_points(logger)
    if kind == "mlflow":
        return mlflow_points(logger)
    runs = wandb_runs(logger.save_dir, finished=1)
    return [point for run in runs for point in wandb_run_points(run)]


def steps_of(points: list[Point], key: str = "train/loss") -> list[int]:
    return [step for name, step, _ in points if name == key]


# ---- 1. a working-directory change between runs ------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_relative_folders_are_resolved_when_the_logger_is_built(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two fits in one process, ``os.chdir`` between them (a notebook, a sweep's trial folders).

    The second logger is built in ``b`` and the fit runs after a chdir to ``c``: its files
    belong in ``b``, where the relative path pointed when the logger was built.
    """
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = build_logger(kind, "logs")
    quiet_trainer(tmp_path, max_steps=3, log_every_n_steps=1, logger=first).fit(
        LinearModule(), make_loader()
    )
    monkeypatch.chdir(tmp_path / "b")
    second = build_logger(kind, "logs")
    monkeypatch.chdir(tmp_path / "c")
    quiet_trainer(tmp_path, max_steps=2, log_every_n_steps=1, logger=second).fit(
        LinearModule(), make_loader()
    )

    for logger, folder, steps in ((first, "a", [0, 1, 2]), (second, "b", [0, 1])):
        assert steps_of(points_of(kind, logger)) == steps, (kind, folder)
        for path in (logger.save_dir, logger.log_dir):
            assert path is None or Path(path).is_relative_to(tmp_path / folder / "logs"), path
    assert os.listdir(tmp_path / "c") == []  # nothing followed the working directory


def test_relative_sqlite_and_file_uris_are_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert MLFlowLogger(tracking_uri="sqlite:///runs/mlflow.db").tracking_uri == (
        f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    )
    assert MLFlowLogger(tracking_uri="file:runs").tracking_uri == (tmp_path / "runs").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "runs2")
    assert MLFlowLogger().save_dir == str(tmp_path / "runs2")
    for absolute in ("sqlite:////data/mlflow.db", "sqlite://", "http://localhost:5000"):
        assert MLFlowLogger(tracking_uri=absolute).tracking_uri == absolute


# ---- 2. kill -9 in the middle of a fit, then fit(ckpt_path="last") ------------------------------
_KILLED_FIT = textwrap.dedent(
    """
    import os, signal, sys
    from tests.conftest import LinearModule, make_loader, quiet_trainer
    from tests.loggers.test_durability import build_logger, checkpointing_trainer, seeded

    kind, root, kill_at, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), eval(sys.argv[4])

    class Killed(LinearModule):
        def on_train_batch_start(self, batch, batch_idx):
            if self.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = checkpointing_trainer(root, build_logger(kind, root, **options))
    trainer.fit(seeded(Killed), make_loader())
    """
)
CHECKPOINT_EVERY, KILL_AT, MAX_STEPS = 4, 10, 16


def seeded(module_class: type[LinearModule] = LinearModule) -> LinearModule:
    """The same initial weights in the killed, resumed and reference runs."""
    import torch

    torch.manual_seed(0)
    return module_class()


def checkpointing_trainer(root: str | Path, logger: Logger) -> Any:
    """Logs every step, checkpoints every 4 steps into ``<root>/checkpoints``, 16 steps."""
    checkpoint = ModelCheckpoint(
        dirpath=Path(root) / "checkpoints", every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1
    )
    return quiet_trainer(
        root,
        max_steps=MAX_STEPS,
        log_every_n_steps=1,
        logger=logger,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )


def kill_a_fit(kind: str, root: Path, **options: Any) -> None:
    """Run a real fit in a subprocess that SIGKILLs itself before step ``KILL_AT``.

    The subprocess starts its own wandb service, as a real job does (not this process's,
    which an earlier test may have left named in WANDB_SERVICE).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_SERVICE")}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_FIT, kind, str(root), str(KILL_AT), repr(options)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert sorted(os.listdir(root / "checkpoints")) == ["epoch=0-step=4", "epoch=0-step=8"]


def reference_points(root: Path) -> list[Point]:
    """The same fit, never interrupted, in a CSV file: what every logger should end with."""
    logger = CSVLogger(root, name="reference")
    quiet_trainer(root, max_steps=MAX_STEPS, log_every_n_steps=1, logger=logger).fit(
        seeded(), make_loader()
    )
    return csv_file_points(logger.log_dir)


def assert_points_match(expected: list[Point], received: list[Point], kind: str) -> None:
    """Same (name, step) pairs, each once; values within float32 precision (TensorBoard's
    ``hp_metric`` placeholder left out)."""
    received = [point for point in received if point[0] != "hp_metric"]
    assert sorted((k, s) for k, s, _ in received) == sorted((k, s) for k, s, _ in expected), kind
    values = {(k, s): v for k, s, v in received}
    for key, step, value in expected:
        assert values[(key, step)] == pytest.approx(value, rel=1e-5, abs=1e-6), (kind, key, step)


@pytest.mark.parametrize("kind", ["csv", "tensorboard", "mlflow"])
def test_a_killed_run_resumes_without_losing_or_repeating_a_step(kind: str, tmp_path: Path) -> None:
    """Defaults (CSV flushes every 100 steps, TensorBoard every 120 s, MLflow every 5 s):
    what was logged up to the checkpoint is on disk when it is, and the resumed run replaces
    what came after it."""
    kill_a_fit(kind, tmp_path)
    if kind != "mlflow":  # MLflow: the run is found through the checkpoint
        killed = build_logger(kind, tmp_path, version=0)
        # rows at Lightning's steps: optimizer steps 1-8 are logged at 0-7
        assert steps_of(points_of(kind, killed))[:8] == list(range(8))

    resumed = build_logger(kind, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing was lost or repeated: nothing to warn about
        checkpointing_trainer(tmp_path, resumed).fit(
            LinearModule(), make_loader(), ckpt_path="last"
        )

    points = points_of(kind, resumed)
    assert steps_of(points) == list(range(MAX_STEPS))  # in write order
    assert_points_match(reference_points(tmp_path), points, kind)


def test_a_killed_mlflow_run_warns_about_the_steps_it_will_hold_twice(tmp_path: Path) -> None:
    """Flushed after the checkpoint (optimizer steps 9 and 10, logged at steps 8 and 9): MLflow
    cannot delete them, so it says so."""
    kill_a_fit("mlflow", tmp_path, flush_interval_s=0)
    resumed = build_logger("mlflow", tmp_path)
    with pytest.warns(UserWarning, match=r"after step 7.*steps 8 to 9.*two values") as record:
        checkpointing_trainer(tmp_path, resumed).fit(
            LinearModule(), make_loader(), ckpt_path="last"
        )
    assert resumed.run_id in str(record[0].message)
    steps = steps_of(mlflow_points(resumed))
    assert sorted(set(steps)) == list(range(MAX_STEPS))
    assert sorted(steps) == sorted([*range(MAX_STEPS), 8, 9])


def test_a_killed_offline_wandb_run_is_continued_and_its_loss_is_reported(
    tmp_path: Path,
) -> None:
    """wandb 0.31 writes the offline ``.wandb`` file in 32 KiB blocks from its service process,
    which stops with a SIGKILLed parent: a short killed run's file keeps only its header. The
    resumed run says which steps are gone and continues the id from the checkpoint's step."""
    kill_a_fit("wandb", tmp_path)
    (killed_file,) = (tmp_path / "wandb").rglob("offline-run-*/run-*.wandb")
    killed_run = read_run(killed_file)  # readable: header only, or whole records

    resumed = build_logger("wandb", tmp_path)
    trainer = checkpointing_trainer(tmp_path, resumed)
    if wandb_run_points(killed_run):  # a later wandb that flushes: nothing to report
        trainer.fit(seeded(), make_loader(), ckpt_path="last")
    else:
        with pytest.warns(UserWarning, match=r"without any record.*up to step 7.*lost"):
            trainer.fit(seeded(), make_loader(), ckpt_path="last")

    killed_run, resumed_run = wandb_runs(resumed.save_dir, finished=1)
    assert resumed_run.run_id == resumed.version == killed_file.name[len("run-") : -len(".wandb")]
    assert resumed_run.exit_code == 0
    assert steps_of(wandb_run_points(resumed_run)) == list(range(8, MAX_STEPS))
    reference = [point for point in reference_points(tmp_path) if point[1] > 7]
    assert_points_match(reference, wandb_run_points(resumed_run), "wandb")


def test_a_checkpoint_without_the_flushed_rows_warns_how_many_are_lost(tmp_path: Path) -> None:
    """A checkpoint saved while rows were still buffered (a checkpoint from before the flush
    at each checkpoint, or a copied folder): the resumed run says which steps are gone."""
    first = CSVLogger(tmp_path, name="exp", flush_logs_every_n_steps=4)
    for step in range(1, 6):
        first.log_metrics({"loss": float(step)}, step)  # steps 1-3 written, 4-5 buffered
    state = {"name": "exp", "version": 0, "step": 5}  # what the checkpoint recorded

    resumed = CSVLogger(tmp_path, name="exp")
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"ends at step 3.*after step 5.*steps 4 to 5 were lost"):
        resumed.log_metrics({"loss": 6.0}, step=6)
        resumed.save()
    assert steps_of(csv_file_points(resumed.log_dir), "loss") == [1, 2, 3, 6]


# ---- 3. logger state from a crafted checkpoint ----------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "version"),
    [
        ("csv", "../../../outside"),
        ("csv", "/tmp/absolute"),
        ("csv", ["version_0"]),
        ("tensorboard", "../../outside"),
        ("tensorboard", -1),
        ("mlflow", "../../outside"),
        ("mlflow", "abc/../../x"),
        ("wandb", "../../outside"),
        ("wandb", "run id"),
    ],
)
def test_a_crafted_logger_state_is_refused_and_nothing_is_written_outside(
    kind: str, version: object, tmp_path: Path
) -> None:
    inside = tmp_path / "inside"
    logger = build_logger(kind, inside)
    state = {"name": "exp", "version": version}
    with pytest.raises(CheckpointError, match=r"version") as caught:
        logger.load_state_dict(state)
    assert repr(version) in str(caught.value) or str(version) in str(caught.value)
    logger.log_metrics({"loss": 1.0}, step=1)  # still usable: writes its own run
    logger.finalize("success")
    # wandb's own cache / config / data folders (isolated_trackers puts them under tmp_path)
    # get its service's debug log when the first run of this process starts: not the logger's.
    tracker_dirs = [tmp_path / f"wandb_{name}" for name in ("dir", "cache", "config", "data")]
    outside = [
        p
        for p in tmp_path.rglob("*")
        if not p.is_relative_to(inside) and not any(p.is_relative_to(d) for d in tracker_dirs)
    ]
    assert outside == []


def test_a_crafted_state_in_a_checkpoint_file_stops_the_resume(tmp_path: Path) -> None:
    """End to end: a checkpoint whose CSV logger version climbs out of save_dir."""
    import json

    logger = CSVLogger(tmp_path / "logs", name="exp")
    trainer = checkpointing_trainer(tmp_path, logger)
    trainer.fit(LinearModule(), make_loader())
    checkpoint = tmp_path / "checkpoints" / "epoch=1-step=16"
    state_path = checkpoint / "state.json"
    state = json.loads(state_path.read_text())
    state["loggers"][0]["version"] = "../../../escaped"
    state_path.write_text(json.dumps(state))
    _rewrite_manifest(checkpoint)

    resumed = CSVLogger(tmp_path / "logs", name="exp")
    trainer = checkpointing_trainer(tmp_path, resumed)
    with pytest.raises(CheckpointError, match=r"version.*escaped"):
        trainer.fit(LinearModule(), make_loader(), ckpt_path=checkpoint)
    assert not (tmp_path / "escaped").exists() and not (tmp_path.parent / "escaped").exists()


def _rewrite_manifest(checkpoint: Path) -> None:
    """Recompute the manifest's sizes and sha256 (what an attacker crafting the file would do)."""
    import hashlib
    import json

    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    files = manifest["files"]
    for name, entry in files.items():
        data = (checkpoint / name).read_bytes()
        entry["size"] = len(data)
        entry["sha256"] = hashlib.sha256(data).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
