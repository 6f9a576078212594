"""Tests of trainer/loggers/csv_logs.py: layout, versions, metrics.csv, hparams.yaml, resume."""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import pytest
import torch
import yaml

from trainer.errors import ConfigurationError
from trainer.loggers.csv_logs import CSVLogger


def read_csv(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def metrics_path(logger: CSVLogger) -> str:
    return os.path.join(logger.log_dir, "metrics.csv")


def test_layout_and_header_has_step_column(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="exp")
    assert logger.save_dir == str(tmp_path)
    assert logger.root_dir == str(tmp_path / "exp")
    assert logger.log_dir == str(tmp_path / "exp" / "version_0")
    assert logger.experiment is logger
    logger.log_metrics({"loss": 0.5, "acc": 0.25}, step=0)
    logger.log_metrics({"loss": 0.25, "acc": 0.5}, step=1)
    logger.finalize("success")

    header, rows = read_csv(tmp_path / "exp" / "version_0" / "metrics.csv")
    assert header == ["acc", "loss", "step"]
    assert rows == [
        {"step": "0", "loss": "0.5", "acc": "0.25"},
        {"step": "1", "loss": "0.25", "acc": "0.5"},
    ]


def test_directory_is_created_lazily(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="exp")
    _ = logger.log_dir, logger.version
    assert not (tmp_path / "exp").exists()
    logger.log_metrics({"loss": 1.0}, step=0)
    assert not (tmp_path / "exp").exists()  # buffered, not written
    logger.save()
    assert (tmp_path / "exp" / "version_0" / "metrics.csv").is_file()


def test_new_key_widens_header_and_leaves_empty_cells(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    assert read_csv(metrics_path(logger))[0] == ["loss", "step"]

    logger.log_metrics({"loss": 0.5}, step=1)
    logger.log_metrics({"val_loss": 0.75}, step=1)
    logger.save()
    header, rows = read_csv(metrics_path(logger))
    assert header == ["loss", "step", "val_loss"]
    assert rows == [
        {"step": "0", "loss": "1.0", "val_loss": ""},
        {"step": "1", "loss": "0.5", "val_loss": ""},
        {"step": "1", "loss": "", "val_loss": "0.75"},
    ]

    logger.log_metrics({"loss": 0.25}, step=2)  # same header: appended
    logger.save()
    _, rows = read_csv(metrics_path(logger))
    assert rows[-1] == {"step": "2", "loss": "0.25", "val_loss": ""}
    assert len(rows) == 4


def test_version_auto_increments(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, name="exp")
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    second = CSVLogger(tmp_path, name="exp")
    (tmp_path / "exp" / "version_notanumber").mkdir()
    (tmp_path / "exp" / "version_7.txt").write_text("not a folder")

    assert first.version == 0
    assert second.version == 1
    assert second.log_dir == str(tmp_path / "exp" / "version_1")
    second.log_hyperparams({"lr": 0.1})
    assert CSVLogger(tmp_path, name="exp").version == 2


def test_int_and_str_versions(tmp_path: Path) -> None:
    assert CSVLogger(tmp_path, name="exp", version=3).log_dir == str(tmp_path / "exp" / "version_3")
    logger = CSVLogger(tmp_path, name="exp", version="run_a")
    assert logger.version == "run_a"
    assert logger.log_dir == str(tmp_path / "exp" / "run_a")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    assert (tmp_path / "exp" / "run_a" / "metrics.csv").is_file()


@pytest.mark.parametrize("name", [None, ""])
def test_no_name_folder(tmp_path: Path, name: str | None) -> None:
    logger = CSVLogger(tmp_path, name=name)
    assert logger.name == ""
    assert logger.root_dir == str(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert (tmp_path / "version_0" / "metrics.csv").is_file()
    assert CSVLogger(tmp_path, name=name).version == 1


def test_hparams_yaml_round_trip(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.1, "layers": (64, 32), "opt": {"name": "SGD"}})
    logger.log_hyperparams(
        argparse.Namespace(batch_size=32, data=Path("/data/mnist"), lr=0.01, dtype=torch.float32)
    )
    with open(os.path.join(logger.log_dir, "hparams.yaml"), encoding="utf-8") as file:
        loaded = yaml.safe_load(file)
    assert loaded == {
        "lr": 0.01,
        "layers": [64, 32],
        "opt": {"name": "SGD"},
        "batch_size": 32,
        "data": "/data/mnist",
        "dtype": "torch.float32",
    }


def test_flush_cadence(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=3)
    path = metrics_path(logger)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_metrics({"loss": 0.5}, step=1)
    assert not os.path.exists(path)
    logger.log_metrics({"loss": 0.25}, step=2)
    assert len(read_csv(path)[1]) == 3

    logger.log_metrics({"loss": 0.125}, step=3)
    logger.log_metrics({"loss": 0.0625}, step=4)
    assert len(read_csv(path)[1]) == 3  # step 4 is 2 steps past the last write (step 2)
    logger.finalize("success")
    assert [row["step"] for row in read_csv(path)[1]] == ["0", "1", "2", "3", "4"]


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    for step in range(5):
        logger.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        if step == 2:
            logger.log_metrics({"val_loss": 0.5}, step=step)  # header rewrite
    logger.log_hyperparams({"lr": 0.1})
    logger.finalize("success")
    assert sorted(os.listdir(logger.log_dir)) == ["hparams.yaml", "metrics.csv"]
    assert len(read_csv(metrics_path(logger))[1]) == 6


def test_failed_write_keeps_previous_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    before = Path(metrics_path(logger)).read_bytes()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    logger.log_metrics({"loss": 0.5, "acc": 0.9}, step=1)  # a new column: the file is rewritten
    with pytest.raises(OSError, match="disk full"):
        logger.save()
    assert Path(metrics_path(logger)).read_bytes() == before
    assert os.listdir(logger.log_dir) == ["metrics.csv"]


def test_resume_keeps_old_rows_without_duplicated_steps(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, name="exp")
    for step in range(6):
        first.log_metrics({"loss": float(step)}, step=step)
    first.log_metrics({"val_loss": 9.0}, step=5)
    first.log_hyperparams({"lr": 0.1})
    first.finalize("failed")

    # Resumed from a checkpoint at step 4: steps 4 and 5 are logged again.
    resumed = CSVLogger(tmp_path, name="exp", version=first.version)
    resumed.log_metrics({"loss": 40.0}, step=4)
    resumed.log_metrics({"loss": 50.0, "acc": 0.5}, step=5)
    resumed.log_metrics({"loss": 60.0}, step=6)
    resumed.log_hyperparams({"batch_size": 8})
    resumed.finalize("success")

    header, rows = read_csv(metrics_path(first))
    assert header == ["acc", "loss", "step", "val_loss"]
    assert [(row["step"], row["loss"]) for row in rows] == [
        ("0", "0.0"),
        ("1", "1.0"),
        ("2", "2.0"),
        ("3", "3.0"),
        ("4", "40.0"),
        ("5", "50.0"),
        ("6", "60.0"),
    ]
    assert rows[5]["acc"] == "0.5" and rows[0]["acc"] == ""
    with open(os.path.join(first.log_dir, "hparams.yaml"), encoding="utf-8") as file:
        assert yaml.safe_load(file) == {"lr": 0.1, "batch_size": 8}


def test_resume_from_a_checkpoint_keeps_exactly_the_rows_it_covered(tmp_path: Path) -> None:
    """Steps are not monotonic (validation step rows are numbered by batch, as in Lightning):
    the checkpoint records the row count, and the resumed run keeps those rows whatever the
    step of the first row it logs."""
    first = CSVLogger(tmp_path, name="exp")
    first.log_metrics({"loss": 1.0}, step=1)
    first.log_metrics({"val_step": 0.5}, step=0)  # a validation step row
    first.log_metrics({"val_step": 0.25}, step=1)
    first.log_metrics({"val": 0.4, "epoch": 0.0}, step=1)
    state = first.state_dict()  # a checkpoint at the end of validation
    assert state == {"name": "exp", "version": 0, "step": 1, "rows": 4}
    first.log_metrics({"loss_epoch": 0.9, "epoch": 0.0}, step=1)  # epoch row: after it, kept
    first.log_metrics({"loss": 0.8}, step=3)  # the interrupted run went on
    first.log_metrics({"val_step": 0.3}, step=2)
    first.finalize("failed")

    resumed = CSVLogger(tmp_path, name="exp")
    resumed.load_state_dict(state)
    resumed.log_metrics({"val_step": 0.35}, step=0)  # the resumed fit validates first
    resumed.log_metrics({"loss": 0.7}, step=3)
    resumed.finalize("success")

    _, rows = read_csv(metrics_path(resumed))
    cells = [{k: v for k, v in row.items() if v} for row in rows]
    assert cells == [
        {"step": "1", "loss": "1.0"},
        {"step": "0", "val_step": "0.5"},
        {"step": "1", "val_step": "0.25"},
        {"step": "1", "val": "0.4", "epoch": "0.0"},
        {"step": "1", "loss_epoch": "0.9", "epoch": "0.0"},
        {"step": "0", "val_step": "0.35"},
        {"step": "3", "loss": "0.7"},
    ]
    assert resumed.state_dict()["rows"] == 7


def test_a_bad_row_count_in_a_checkpoint_is_refused(tmp_path: Path) -> None:
    from trainer.errors import CheckpointError

    with pytest.raises(CheckpointError, match="field 'rows': expected an int >= 0.*received"):
        CSVLogger(tmp_path).load_state_dict({"name": "x", "version": 0, "step": 3, "rows": -1})


def test_resume_after_last_step_appends(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, version=0)
    first.log_metrics({"loss": 1.0}, step=0)
    first.log_metrics({"loss": 0.5}, step=1)
    first.finalize("success")
    resumed = CSVLogger(tmp_path, version=0)
    resumed.log_metrics({"loss": 0.25}, step=2)
    resumed.finalize("success")
    assert [row["step"] for row in read_csv(metrics_path(resumed))[1]] == ["0", "1", "2"]


def test_tensor_values_become_plain_floats(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, prefix="train")
    logger.log_metrics({"loss": torch.tensor(0.5), "count": 3}, step=torch.tensor(7))
    logger.log_metrics({"loss": torch.tensor([0.25])})  # step None: one past the last
    logger.save()
    header, rows = read_csv(metrics_path(logger))
    assert header == ["step", "train-count", "train-loss"]
    assert rows == [
        {"step": "7", "train-loss": "0.5", "train-count": "3.0"},
        {"step": "8", "train-loss": "0.25", "train-count": ""},
    ]


@pytest.mark.parametrize(
    ("kwargs", "argument", "received"),
    [
        ({"flush_logs_every_n_steps": 0}, "flush_logs_every_n_steps", "0 (type int)"),
        ({"flush_logs_every_n_steps": 2.5}, "flush_logs_every_n_steps", "2.5 (type float)"),
        ({"version": -1}, "version", "-1 (type int)"),
        ({"version": 1.0}, "version", "1.0 (type float)"),
        ({"name": 3}, "name", "3 (type int)"),
        ({"save_dir": None}, "save_dir", "None (type NoneType)"),
        ({"prefix": None}, "prefix", "None (type NoneType)"),
    ],
)
def test_bad_argument_names_argument_and_value(
    tmp_path: Path, kwargs: dict[str, object], argument: str, received: str
) -> None:
    kwargs = {"save_dir": tmp_path, **kwargs}
    with pytest.raises(ConfigurationError, match=argument) as info:
        CSVLogger(**kwargs)  # type: ignore[arg-type]  # wrong types on purpose
    assert received in str(info.value)


def test_bad_metric_value_is_rejected_without_trace(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    with pytest.raises(ConfigurationError, match=r"'acc'.*tensor\(\[1\., 2\.\]\)"):
        logger.log_metrics({"loss": 1.0, "acc": torch.tensor([1.0, 2.0])}, step=0)
    with pytest.raises(ConfigurationError, match="step"):
        logger.log_metrics({"loss": 1.0}, step=1.5)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ConfigurationError, match="named 'step'"):
        logger.log_metrics({"step": 1.0}, step=0)
    with pytest.raises(ConfigurationError, match="log_hyperparams"):
        logger.log_hyperparams([("lr", 0.1)])  # type: ignore[arg-type]  # on purpose
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    assert read_csv(metrics_path(logger)) == (["loss", "step"], [{"step": "0", "loss": "1.0"}])


def test_save_without_metrics_writes_nothing(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.save()
    logger.finalize("success")
    assert not os.path.exists(logger.root_dir)


def test_flush_counts_steps_not_calls(tmp_path: Path) -> None:
    """Logged every 50 steps with the default 100: written every 100 steps, not every 100 calls."""
    logger = CSVLogger(tmp_path)
    path = metrics_path(logger)
    logger.log_metrics({"loss": 1.0}, step=50)
    assert not os.path.exists(path)
    logger.log_metrics({"loss": 0.5}, step=100)
    assert [row["step"] for row in read_csv(path)[1]] == ["50", "100"]
    logger.log_metrics({"loss": 0.4}, step=150)
    assert len(read_csv(path)[1]) == 2
    logger.log_metrics({"loss": 0.3}, step=200)
    assert len(read_csv(path)[1]) == 4


def test_same_header_flushes_append_rows(tmp_path: Path) -> None:
    """With an unchanged header a flush appends (no rewrite); the rows are all there in order."""
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_metrics({"loss": 1.0}, step=0)
    inode = os.stat(metrics_path(logger)).st_ino
    for step in range(1, 4):
        logger.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    assert os.stat(metrics_path(logger)).st_ino == inode  # the same file, appended to
    logger.finalize("success")
    assert [row["step"] for row in read_csv(metrics_path(logger))[1]] == ["0", "1", "2", "3"]


def test_accelerate_style_log_writes_text_cells_and_flattened_dict_columns(
    tmp_path: Path,
) -> None:
    """``tracker.log`` (what ``accelerator.log`` calls): a str is a cell (quoted as CSV needs), a
    dict becomes ``<key>/<member>`` columns (nested too); None and a list are dropped with a
    warning naming the key. It dropped every str and dict before."""
    logger = CSVLogger(tmp_path, name="exp", prefix="train", flush_logs_every_n_steps=1)
    logger.log({"loss": torch.tensor(0.5), "note": 'a, "quoted"\nline'}, step=0)
    with pytest.warns(UserWarning, match="CSVLogger.log: ") as caught:
        logger.log({"group": {"a": 1, "inner": {"b": 2.5}, "s": "x", "none": None}, "l": [1]})
    logger.finalize("success")

    assert sorted(str(w.message).split("'")[1] for w in caught) == ["group/none", "l"]
    header, rows = read_csv(metrics_path(logger))  # widened at step 1: the file was rewritten
    assert header == [
        "step",
        "train-group/a",
        "train-group/inner/b",
        "train-group/s",
        "train-loss",
        "train-note",
    ]
    assert [{k: v for k, v in row.items() if v} for row in rows] == [
        {"step": "0", "train-loss": "0.5", "train-note": 'a, "quoted"\nline'},
        {"step": "1", "train-group/a": "1.0", "train-group/inner/b": "2.5", "train-group/s": "x"},
    ]
