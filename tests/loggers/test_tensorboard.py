"""Tests of trainer/loggers/tensorboard.py: real event files, read back with EventAccumulator."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest
import torch

from trainer.errors import ConfigurationError
from trainer.loggers.tensorboard import TensorBoardLogger

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)
from tensorboard.plugins.hparams import plugin_data_pb2


def read_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar point of ``log_dir`` as tag -> [(step, value)], in the order TB shows them."""
    accumulator = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def read_hparams(log_dir: str) -> dict[str, object]:
    """The hyperparameters of the last hparams-plugin session record of ``log_dir``."""
    accumulator = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    accumulator.Reload()
    metadata = accumulator.SummaryMetadata("_hparams_/session_start_info")
    data = plugin_data_pb2.HParamsPluginData.FromString(metadata.plugin_data.content)
    values = {}
    for key, value in data.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        values[key] = getattr(value, kind)
    return values


def read_metric_columns(log_dir: str) -> list[str]:
    """The metric columns the HPARAMS tab shows (from the experiment record)."""
    accumulator = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    accumulator.Reload()
    metadata = accumulator.SummaryMetadata("_hparams_/experiment")
    data = plugin_data_pb2.HParamsPluginData.FromString(metadata.plugin_data.content)
    return [info.name.tag for info in data.experiment.metric_infos]


def test_layout_and_scalars_read_back(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="exp")
    assert logger.save_dir == str(tmp_path)
    assert logger.root_dir == str(tmp_path / "exp")
    assert logger.log_dir == str(tmp_path / "exp" / "version_0")
    assert not (tmp_path / "exp").exists()  # nothing is created before the first write
    for step in range(0, 100, 10):
        logger.log_metrics({"train/loss": 1.0 / (step + 1), "epoch": torch.tensor(0.0)}, step)
    logger.finalize("success")

    scalars = read_scalars(logger.log_dir)
    assert sorted(scalars) == ["epoch", "train/loss"]
    steps = [step for step, _ in scalars["train/loss"]]
    assert steps == list(range(0, 100, 10))
    values = [value for _, value in scalars["train/loss"]]
    assert values == pytest.approx([1.0 / (s + 1) for s in steps], rel=1e-6)  # float32 on disk
    assert TensorBoardLogger(tmp_path, name="exp").version == 1  # the next free number


def test_version_name_sub_dir_and_prefix(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name=None, version="run_a", sub_dir="fold_1", prefix="k")
    assert logger.log_dir == str(tmp_path / "run_a" / "fold_1")
    assert logger.sub_dir == "fold_1"
    logger.log_metrics({"loss": 2.0})  # step None: 0, then one past the last
    logger.log_metrics({"loss": 1.0})
    logger.finalize("success")
    assert read_scalars(logger.log_dir) == {"k-loss": [(0, 2.0), (1, 1.0)]}
    assert TensorBoardLogger(tmp_path, version=3).log_dir == str(
        tmp_path / "trainer_logs" / "version_3"
    )


def test_hyperparams_go_to_the_hparams_plugin_with_hp_metric(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    logger.log_hyperparams(
        argparse.Namespace(lr=0.1, optimizer={"name": "sgd", "momentum": 0.9}, layers=(4, 2))
    )
    logger.finalize("success")

    assert read_hparams(logger.log_dir) == {
        "lr": 0.1,
        "optimizer/name": "sgd",
        "optimizer/momentum": 0.9,
        "layers": "(4, 2)",
    }
    assert read_scalars(logger.log_dir) == {"hp_metric": [(0, -1.0)]}
    assert read_metric_columns(logger.log_dir) == ["hp_metric"]


def test_hyperparams_with_metrics_and_without_default_hp_metric(tmp_path: Path) -> None:
    with_metrics = TensorBoardLogger(tmp_path, version=0)
    with_metrics.log_hyperparams({"lr": 0.1}, metrics={"val/loss": 0.5})
    with_metrics.finalize("success")
    assert read_scalars(with_metrics.log_dir) == {"val/loss": [(0, 0.5)]}
    assert read_metric_columns(with_metrics.log_dir) == ["val/loss"]

    without = TensorBoardLogger(tmp_path, version=1, default_hp_metric=False)
    without.log_hyperparams({"lr": 0.1, "scheduler": None})
    without.finalize("success")
    assert read_scalars(without.log_dir) == {}
    assert read_hparams(without.log_dir) == {"lr": 0.1, "scheduler": "None"}


def test_hparams_yaml_beside_the_events_nested_and_merged(tmp_path: Path) -> None:
    """As Lightning's TensorBoardLogger: ``hparams.yaml`` in log_dir, the values as logged."""
    yaml = pytest.importorskip("yaml")
    logger = TensorBoardLogger(tmp_path, sub_dir="fold_1")
    logger.log_hyperparams({"lr": 0.1, "optimizer": {"name": "sgd"}, "layers": (4, 2)})
    logger.log_hyperparams(argparse.Namespace(lr=0.2, seed=3))  # later calls merge
    path = Path(logger.log_dir) / "hparams.yaml"
    expected = {"lr": 0.2, "optimizer": {"name": "sgd"}, "layers": [4, 2], "seed": 3}
    assert yaml.safe_load(path.read_text()) == expected  # written at once, not at the end
    logger.finalize("success")
    assert yaml.safe_load(path.read_text()) == expected
    assert sorted(os.listdir(logger.log_dir))[-1] == "hparams.yaml"  # no temporary file left

    resumed = TensorBoardLogger(tmp_path, sub_dir="fold_1", version=0)
    resumed.log_hyperparams({"epochs": 5})  # a resumed run merges into the earlier file
    assert yaml.safe_load(path.read_text()) == {**expected, "epochs": 5}


def test_hparams_yaml_after_a_successful_run_even_without_hyperparameters(
    tmp_path: Path,
) -> None:
    """Lightning leaves ``{}`` in a finished run's folder; not in a failed one's, nor without one."""
    finished = TensorBoardLogger(tmp_path, version=0)
    finished.log_metrics({"loss": 1.0}, step=0)
    finished.finalize("success")
    assert (Path(finished.log_dir) / "hparams.yaml").read_text() == "{}\n"

    failed = TensorBoardLogger(tmp_path, version=1)
    failed.log_metrics({"loss": 1.0}, step=0)
    failed.finalize("failed")
    assert not (Path(failed.log_dir) / "hparams.yaml").exists()

    nothing_logged = TensorBoardLogger(tmp_path, version=2)
    nothing_logged.finalize("success")
    assert not Path(nothing_logged.log_dir).exists()


def test_a_broken_hparams_yaml_of_a_resumed_version_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "trainer_logs" / "version_0"
    folder.mkdir(parents=True)
    (folder / "hparams.yaml").write_text("lr: [unclosed\n")
    logger = TensorBoardLogger(tmp_path, version=0)
    with pytest.raises(ConfigurationError, match=r"TensorBoardLogger.*hparams\.yaml"):
        logger.log_hyperparams({"lr": 0.1})
    assert (folder / "hparams.yaml").read_text() == "lr: [unclosed\n"  # left as it was


def test_log_graph_only_when_asked(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    model.example_input_array = torch.zeros(1, 3)

    off = TensorBoardLogger(tmp_path, version="off")
    off.log_graph(model)
    assert off._experiment is None  # nothing traced, nothing written

    on = TensorBoardLogger(tmp_path, version="on", log_graph=True)
    on.log_graph(model)
    on.finalize("success")
    accumulator = EventAccumulator(on.log_dir)
    accumulator.Reload()
    assert accumulator.Tags()["graph"] is True
    assert "Linear" in str(accumulator.Graph())

    with pytest.warns(UserWarning, match="example_input_array"):
        TensorBoardLogger(tmp_path, version="none", log_graph=True).log_graph(torch.nn.Linear(1, 1))


def _next_second() -> None:
    """Event file names carry the creation second: keep an interrupted and a resumed file apart."""
    time.sleep(1.01 - time.time() % 1)


def test_resume_drops_the_points_logged_after_the_checkpoint(tmp_path: Path) -> None:
    crashed = TensorBoardLogger(tmp_path)
    crashed.log_hyperparams({"lr": 0.1})
    for step in range(10):
        crashed.log_metrics({"loss": float(step)}, step)
        if step == 4:
            checkpoint_state = crashed.state_dict()  # a checkpoint at step 4, then a crash at 9
    crashed.save()
    # the folder's identity, and the last step the checkpoint covers (flushed with it)
    assert checkpoint_state == {"name": "trainer_logs", "version": 0, "step": 4}
    _next_second()

    resumed = TensorBoardLogger(tmp_path)
    resumed.load_state_dict(checkpoint_state)
    resumed.log_hyperparams({"lr": 0.1})  # no second hp_metric point at step 0
    for step in range(5, 8):
        resumed.log_metrics({"loss": 100.0 + step}, step)
    resumed.finalize("success")

    assert resumed.log_dir == crashed.log_dir
    events = [name for name in os.listdir(resumed.log_dir) if name.startswith("events.")]
    assert len(events) == 2  # one event file per session
    scalars = read_scalars(resumed.log_dir)
    kept = [(step, float(step)) for step in range(5)]
    assert scalars["loss"] == [*kept, (5, 105.0), (6, 106.0), (7, 107.0)]
    assert scalars["hp_metric"] == [(0, -1.0)]
    assert read_hparams(resumed.log_dir) == {"lr": 0.1}  # written after the purge, so kept


def test_resume_purges_from_the_step_after_the_checkpoint_not_the_first_step(
    tmp_path: Path,
) -> None:
    """A resumed fit may first log a validation step point, numbered by batch (step 0, as in
    Lightning): the older points up to the checkpoint's step stay."""
    crashed = TensorBoardLogger(tmp_path, default_hp_metric=False)
    for step in range(4):
        crashed.log_metrics({"loss": float(step)}, step)
    checkpoint_state = crashed.state_dict()
    crashed.log_metrics({"loss": 40.0}, 4)  # after the checkpoint: superseded
    crashed.save()
    _next_second()

    resumed = TensorBoardLogger(tmp_path, default_hp_metric=False)
    resumed.load_state_dict(checkpoint_state)
    resumed.log_metrics({"val_step": 0.5}, 0)
    resumed.log_metrics({"loss": 4.0}, 4)
    resumed.finalize("success")

    scalars = read_scalars(resumed.log_dir)
    assert scalars["loss"] == [(step, float(step)) for step in range(5)]
    assert scalars["val_step"] == [(0, 0.5)]


def test_given_version_wins_over_the_checkpoint(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, version=7)
    logger.load_state_dict({"name": "trainer_logs", "version": 0})
    assert logger.version == 7
    started = TensorBoardLogger(tmp_path)
    started.log_metrics({"loss": 1.0}, 0)  # the writer exists: its folder is fixed
    started.load_state_dict({"name": "trainer_logs", "version": 5})
    assert started.version == 0
    started.finalize("success")


def test_bad_input_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"version.*received -1 \(type int\)"):
        TensorBoardLogger(tmp_path, version=-1)
    with pytest.raises(ConfigurationError, match="save_dir"):
        TensorBoardLogger(None)  # type: ignore[arg-type]
    logger = TensorBoardLogger(tmp_path)
    with pytest.raises(ConfigurationError, match=r"step to be an int.*step=trainer.global_step"):
        logger.log_metrics({"loss": 1.0}, step=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"metric 'loss'.*loss.item\(\)"):
        logger.log_metrics({"loss": "high"}, step=1)
    with pytest.raises(ConfigurationError, match="argparse.Namespace"):
        logger.log_hyperparams(["lr", 0.1])  # type: ignore[arg-type]
    logger.finalize("success")


def test_a_metric_that_is_not_a_scalar_is_refused_naming_the_logger_and_key(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="exp")
    with pytest.raises(
        ConfigurationError, match=r"TensorBoardLogger expected metric 'acc'.*tensor"
    ):
        logger.log_metrics({"acc": torch.tensor([1.0, 2.0])}, step=0)
    logger.finalize("success")


def test_fit_writes_the_graph_of_a_module_with_an_example_input(tmp_path: Path) -> None:
    """As Lightning: TensorBoardLogger(log_graph=True) gets the module's graph at fit start."""
    import trainer
    from tests.conftest import LinearModule, make_loader

    module = LinearModule()
    module.example_input_array = torch.zeros(2, 4)
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    fit = trainer.Trainer(
        max_epochs=1, logger=logger, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )  # fmt: skip
    fit.fit(module, make_loader())
    accumulator = EventAccumulator(logger.log_dir)
    accumulator.Reload()
    assert accumulator.Tags()["graph"] is True


def _runs_scalars(root: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(sub-run folder, tag) -> points of every event folder under ``root`` ("" for ``root``)."""
    found = {}
    for folder in sorted({p.parent for p in root.rglob("events.out.tfevents.*")}):
        sub_run = "" if folder == root else folder.name
        for tag, points in read_scalars(str(folder)).items():
            found[(sub_run, tag)] = points
    return found


def test_accelerate_style_log_drops_dict_members_that_are_not_numbers(tmp_path: Path) -> None:
    """A dict member that is not a number is dropped with a warning naming ``<key>/<member>``;
    the numbers are the sub-runs Accelerate's TensorBoardTracker writes for them (read back from
    both). It raised ConfigurationError on the main process (Accelerate raises ValueError)."""
    accelerate = pytest.importorskip("accelerate")
    from trainer import Accelerator

    numbers = {"loss": torch.tensor(0.25), "group": {"a": torch.tensor(1.0), "b": 2}}
    theirs = accelerate.Accelerator(
        cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "accelerate")
    )
    theirs.init_trackers("proj")
    theirs.log(numbers, step=4)
    theirs.end_training()
    ours = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "ours"))
    ours.init_trackers("proj")
    with pytest.warns(UserWarning, match="TensorBoardLogger.log: ") as caught:
        ours.log({**numbers, "group": {**numbers["group"], "s": "x", "n": None}}, step=4)
    (logger,) = ours.trackers
    ours.end_training()

    assert sorted(str(w.message).split("'")[1] for w in caught) == ["group/n", "group/s"]
    received = _runs_scalars(Path(logger.log_dir))
    assert received == {
        ("", "loss"): [(4, 0.25)],
        ("group_a", "group"): [(4, 1.0)],
        ("group_b", "group"): [(4, 2.0)],
    }
    assert received == _runs_scalars(tmp_path / "accelerate" / "proj")
