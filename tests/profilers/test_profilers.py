"""trainer.profilers: real timings, real cProfile, real torch.profiler traces (DESIGN §9)."""

from __future__ import annotations

import json
import pickle
import pstats
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from trainer.errors import ConfigurationError
from trainer.profilers import (
    AdvancedProfiler,
    PassThroughProfiler,
    Profiler,
    PyTorchProfiler,
    SimpleProfiler,
    resolve_profiler,
)


def _rows(summary: str) -> dict[str, list[str]]:
    """The table of a SimpleProfiler summary: action -> its other cells."""
    rows = {}
    for line in summary.splitlines():
        if line.startswith("| "):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def _action_order(summary: str) -> list[str]:
    return [name for name in _rows(summary) if name not in ("Action", "Total")]


def _matmul_steps(profiler: Profiler, steps: int, action: str = "training_step") -> None:
    for _ in range(steps):
        with profiler.profile("run_training_batch"), profiler.profile(action):
            (torch.randn(32, 32) @ torch.randn(32, 32)).sum()


# --- SimpleProfiler -------------------------------------------------------------------------


def test_simple_profiler_counts_calls_and_sorts_by_total_time():
    profiler = SimpleProfiler()
    profiler.setup("fit")
    for _ in range(5):
        with profiler.profile("get_train_batch"):
            time.sleep(0.002)
    with profiler.profile("save_checkpoint"):
        time.sleep(0.05)
    profiler.start("log_metrics")
    profiler.stop("log_metrics")

    summary = profiler.summary()
    rows = _rows(summary)

    assert summary.startswith("FIT Profiler Report")
    assert rows["Action"] == [
        "Mean duration (s)",
        "Num calls",
        "Total time (s)",
        "Percentage %",
    ]
    assert _action_order(summary) == ["save_checkpoint", "get_train_batch", "log_metrics"]
    mean, calls, total, _ = rows["get_train_batch"]
    assert calls == "5"
    assert float(mean) >= 0.002
    assert float(total) >= 0.010
    assert float(total) == pytest.approx(5 * float(mean), rel=1e-3)
    assert rows["save_checkpoint"][1] == "1"
    assert float(rows["save_checkpoint"][2]) >= 0.05
    assert rows["Total"][1] == "7"  # every call of every action


def test_simple_profiler_percentages_are_shares_of_the_run():
    profiler = SimpleProfiler()
    profiler.setup("fit")
    for _ in range(3):
        with profiler.profile("training_step"):
            time.sleep(0.01)
        time.sleep(0.01)  # time outside any action
    rows = _rows(profiler.summary())

    share = float(rows["training_step"][3])
    run_seconds = float(rows["Total"][2])
    assert run_seconds >= 0.06
    assert share == pytest.approx(100 * float(rows["training_step"][2]) / run_seconds, rel=0.05)
    assert 20 < share < 80  # about half of the run was inside the action
    assert rows["Total"][3] == "100 %"


def test_simple_profiler_nested_actions_each_get_a_row():
    profiler = SimpleProfiler()
    for _ in range(2):
        with profiler.profile("run_training_batch"):
            with profiler.profile("training_step"):
                time.sleep(0.005)
            with profiler.profile("[Callback]Timer.on_train_batch_end"):
                pass
    rows = _rows(profiler.summary())

    assert float(rows["run_training_batch"][2]) >= float(rows["training_step"][2])
    assert rows["[Callback]Timer.on_train_batch_end"][1] == "2"
    top_level = float(rows["run_training_batch"][3])
    assert 0 < top_level <= 100


def test_simple_profiler_not_extended_reports_mean_and_total_sorted_by_mean():
    profiler = SimpleProfiler(extended=False)
    for _ in range(10):
        with profiler.profile("many_short"):
            time.sleep(0.001)
    with profiler.profile("one_long"):
        time.sleep(0.02)
    summary = profiler.summary()

    assert _rows(summary)["Action"] == ["Mean duration (s)", "Total time (s)"]
    assert _action_order(summary) == ["one_long", "many_short"]


def test_simple_profiler_setup_starts_a_new_report_per_stage():
    profiler = SimpleProfiler()
    profiler.setup("fit")
    with profiler.profile("training_step"):
        pass
    profiler.setup("test")
    with profiler.profile("test_step"):
        pass
    summary = profiler.summary()

    assert summary.startswith("TEST Profiler Report")
    assert _action_order(summary) == ["test_step"]


def test_simple_profiler_with_nothing_recorded_reports_only_the_title():
    profiler = SimpleProfiler()
    profiler.setup("validate")
    assert profiler.summary().strip() == "VALIDATE Profiler Report"


def test_simple_profiler_rejects_unbalanced_start_and_stop():
    profiler = SimpleProfiler()
    profiler.start("backward")
    with pytest.raises(ConfigurationError, match="already running"):
        profiler.start("backward")
    with pytest.raises(ConfigurationError, match=r"never started\. Call start\('zero_grad'\)"):
        profiler.stop("zero_grad")


def test_profile_stops_the_action_when_the_block_raises():
    profiler = SimpleProfiler()
    with pytest.raises(RuntimeError, match="boom"), profiler.profile("optimizer_step"):
        raise RuntimeError("boom")
    with profiler.profile("optimizer_step") as name:  # not left running by the failure
        assert name == "optimizer_step"
    assert _rows(profiler.summary())["optimizer_step"][1] == "2"


# --- where reports go -----------------------------------------------------------------------


def test_describe_writes_stage_and_filename_into_dirpath(tmp_path: Path, capsys):
    profiler = SimpleProfiler(dirpath=tmp_path / "profiles", filename="perf")
    profiler.setup("fit")
    with profiler.profile("training_step"):
        time.sleep(0.001)
    profiler.describe()

    assert [p.name for p in (tmp_path / "profiles").iterdir()] == ["fit-perf.txt"]
    text = (tmp_path / "profiles" / "fit-perf.txt").read_text()
    assert text.startswith("FIT Profiler Report")
    assert "training_step" in text
    assert capsys.readouterr().out == ""  # written instead of printed, as in Lightning


def test_describe_appends_one_file_per_stage_and_local_rank(tmp_path: Path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="perf")
    for stage in ("fit", "fit", "test"):
        profiler.setup(stage, local_rank=1)
        with profiler.profile(f"{stage}_action"):
            pass
        profiler.describe()
        profiler.teardown(stage)  # after describe, as the Trainer does: harmless twice

    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit-perf-1.txt", "test-perf-1.txt"]
    assert (tmp_path / "fit-perf-1.txt").read_text().count("FIT Profiler Report") == 2


def test_setup_uses_log_dir_when_dirpath_is_none(tmp_path: Path):
    profiler = SimpleProfiler(filename="perf")
    profiler.setup("validate", log_dir=str(tmp_path / "logs"))
    with profiler.profile("validation_step"):
        pass
    profiler.describe()

    assert profiler.dirpath == str(tmp_path / "logs")
    assert (tmp_path / "logs" / "validate-perf.txt").is_file()


def test_explicit_dirpath_wins_over_log_dir(tmp_path: Path):
    profiler = SimpleProfiler(dirpath=tmp_path / "mine", filename="perf")
    profiler.setup("fit", log_dir=str(tmp_path / "logs"))
    with profiler.profile("training_step"):
        pass
    profiler.describe()
    assert (tmp_path / "mine" / "fit-perf.txt").is_file()
    assert not (tmp_path / "logs").exists()


def test_describe_prints_on_rank_zero_only_when_there_is_no_filename(
    tmp_path: Path, capsys, monkeypatch
):
    profiler = SimpleProfiler(dirpath=tmp_path)
    profiler.setup("fit")
    with profiler.profile("training_step"):
        pass
    profiler.describe()
    assert "FIT Profiler Report" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setenv("RANK", "1")  # what torchrun sets on the second process
    profiler.setup("fit")
    with profiler.profile("training_step"):
        pass
    profiler.describe()
    assert capsys.readouterr().out == ""


def test_profiler_rejects_bad_dirpath_and_filename():
    with pytest.raises(ConfigurationError, match=r"SimpleProfiler\(dirpath=...\) received 3"):
        SimpleProfiler(dirpath=3)  # type: ignore[arg-type]  # the wrong type is the point
    with pytest.raises(ConfigurationError, match="Pass e.g. filename='perf'"):
        AdvancedProfiler(filename=Path("perf"))  # type: ignore[arg-type]  # the wrong type is the point


def test_a_custom_profiler_needs_only_start_and_stop():
    class Recorder(Profiler):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[str] = []

        def start(self, action_name: str) -> None:
            self.events.append(f"start {action_name}")

        def stop(self, action_name: str) -> None:
            self.events.append(f"stop {action_name}")

    recorder = Recorder()
    with recorder.profile("outer"), recorder.profile("inner"):
        pass
    assert recorder.events == ["start outer", "start inner", "stop inner", "stop outer"]
    assert recorder.summary() == ""
    with pytest.raises(TypeError):
        Profiler()  # type: ignore[abstract]  # the base class is abstract


# --- AdvancedProfiler -----------------------------------------------------------------------


def _distinctive_outer_work() -> int:
    return sum(i * i for i in range(20_000))


def _distinctive_inner_work() -> list[int]:
    return sorted(range(20_000), key=lambda i: -i)


def test_advanced_profiler_reports_the_functions_each_action_ran():
    profiler = AdvancedProfiler()
    profiler.setup("fit")
    with profiler.profile("training_step"):
        _distinctive_outer_work()
        with profiler.profile("backward"):
            _distinctive_inner_work()
        _distinctive_outer_work()
    summary = profiler.summary()

    assert summary.startswith("FIT Profiler Report")
    outer, inner = summary.split("Profile stats for: backward")
    assert "Profile stats for: training_step" in outer
    assert "_distinctive_outer_work" in outer
    assert "_distinctive_inner_work" not in outer  # the enclosing action pauses while nested
    assert "_distinctive_inner_work" in inner
    assert "Ordered by: cumulative time" in inner
    assert outer.count("_distinctive_outer_work") == 1  # one row, 2 calls
    assert "2    " in outer.split("_distinctive_outer_work")[0].splitlines()[-1]


def test_advanced_profiler_line_count_restriction_and_dump_stats(tmp_path: Path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="cprof", line_count_restriction=3)
    profiler.setup("test")
    with profiler.profile("test_step"):
        json.dumps({"numbers": list(range(2000))})
    profiler.dump_stats = True
    summary = profiler.summary()

    assert "due to restriction <3>" in summary
    dumped = tmp_path / "test-cprof-test_step.prof"
    assert "dumps" in str(pstats.Stats(str(dumped)).stats)
    profiler.describe()
    assert (tmp_path / "test-cprof.txt").is_file()


def test_advanced_profiler_teardown_disables_cprofile_and_forgets():
    profiler = AdvancedProfiler()
    profiler.start("left_running")
    profiler.teardown("fit")
    assert sys.getprofile() is None
    assert profiler.summary() == "Profiler Report"
    with pytest.raises(ConfigurationError, match="not running"):
        profiler.stop("left_running")


def test_advanced_profiler_pickles_without_its_cprofile_objects():
    profiler = AdvancedProfiler(filename="cprof", line_count_restriction=5)
    with profiler.profile("training_step"):
        _distinctive_outer_work()
    copy = pickle.loads(pickle.dumps(profiler))
    assert (copy.filename, copy.line_count_restriction) == ("cprof", 5)
    with copy.profile("training_step"):
        _distinctive_outer_work()
    assert "_distinctive_outer_work" in copy.summary()


def test_advanced_profiler_rejects_bad_line_count_restriction():
    with pytest.raises(ConfigurationError, match="Pass e.g. 20 or 0.1"):
        AdvancedProfiler(line_count_restriction=-1)


# --- PyTorchProfiler ------------------------------------------------------------------------


def _trace_events(path: Path) -> list[dict]:
    trace = json.loads(path.read_text())
    assert "traceEvents" in trace
    return trace["traceEvents"]


def test_pytorch_profiler_writes_a_chrome_trace_of_the_recorded_steps(tmp_path: Path):
    profiler = PyTorchProfiler(dirpath=tmp_path)
    profiler.setup("fit")
    _matmul_steps(profiler, 6)  # the default schedule: wait 1, warm up 1, record 3
    summary = profiler.summary()
    profiler.teardown("fit")

    assert [p.name for p in tmp_path.iterdir()] == ["fit-training_step.pt.trace.json"]
    events = _trace_events(tmp_path / "fit-training_step.pt.trace.json")
    names = {event.get("name") for event in events}
    assert "[trainer]training_step" in names
    assert "[trainer]run_training_batch" in names
    assert "aten::mm" in names
    steps = {name for name in names if str(name).startswith("ProfilerStep#")}
    assert len(steps) == 3  # the 3 active steps of one cycle
    assert summary.startswith("FIT Profiler Report")
    assert "aten::mm" in summary
    assert "Self CPU" in summary


def test_pytorch_profiler_names_traces_by_filename_and_rank_in_log_dir(tmp_path: Path):
    profiler = PyTorchProfiler(filename="prof")
    profiler.setup("fit", local_rank=1, log_dir=str(tmp_path))
    _matmul_steps(profiler, 5)
    profiler.describe()

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fit-prof-1-training_step.pt.trace.json",
        "fit-prof-1.txt",
    ]
    assert "aten::mm" in (tmp_path / "fit-prof-1.txt").read_text()
    _trace_events(tmp_path / "fit-prof-1-training_step.pt.trace.json")


def test_pytorch_profiler_steps_on_the_evaluation_step_when_only_evaluating(tmp_path: Path):
    profiler = PyTorchProfiler(dirpath=tmp_path)
    profiler.setup("test")
    _matmul_steps(profiler, 5, action="test_step")
    profiler.describe()

    names = {e.get("name") for e in _trace_events(tmp_path / "test-test_step.pt.trace.json")}
    assert "[trainer]test_step" in names


def test_pytorch_profiler_short_run_records_every_step_after_expect_steps(tmp_path: Path):
    profiler = PyTorchProfiler(dirpath=tmp_path)
    profiler.setup("fit")
    profiler.expect_steps(1)  # fast_dev_run: the default schedule would record nothing
    _matmul_steps(profiler, 1)
    profiler.teardown("fit")

    names = {e.get("name") for e in _trace_events(tmp_path / "fit-training_step.pt.trace.json")}
    assert "[trainer]training_step" in names


def test_pytorch_profiler_short_run_without_hint_warns_with_the_fix(tmp_path: Path):
    profiler = PyTorchProfiler(dirpath=tmp_path)
    profiler.setup("fit")
    _matmul_steps(profiler, 1)
    with pytest.warns(UserWarning, match=r"1 step\(s\) ran.*expect_steps\(1\)"):
        assert profiler.summary() == ""
    assert list(tmp_path.iterdir()) == []


def test_pytorch_profiler_without_steps_reports_nothing_and_does_not_warn(tmp_path: Path):
    profiler = PyTorchProfiler(dirpath=tmp_path)
    profiler.setup("fit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with profiler.profile("[Callback]ModelCheckpoint.setup"):
            torch.randn(4).sum()
        profiler.describe()
        profiler.teardown("fit")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
def test_pytorch_profiler_passes_schedule_and_torch_arguments_through(tmp_path: Path):
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=2)
    profiler = PyTorchProfiler(dirpath=tmp_path, schedule=schedule, record_shapes=True)
    profiler.setup("fit")
    _matmul_steps(profiler, 4)
    profiler.teardown("fit")

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fit-training_step-2.pt.trace.json",
        "fit-training_step.pt.trace.json",
    ]
    events = _trace_events(tmp_path / "fit-training_step.pt.trace.json")
    mm = next(e for e in events if e.get("name") == "aten::mm")
    assert mm["args"]["Input Dims"] == [[32, 32], [32, 32]]  # record_shapes reached torch


def test_pytorch_profiler_export_to_chrome_false_writes_no_trace(tmp_path: Path):
    profiler = PyTorchProfiler(dirpath=tmp_path, export_to_chrome=False)
    profiler.setup("fit")
    _matmul_steps(profiler, 5)
    assert "aten::mm" in profiler.summary()
    assert list(tmp_path.iterdir()) == []


def test_pytorch_profiler_rejects_what_torch_would_reject():
    with pytest.raises(ConfigurationError, match="record_shape, which torch.profiler.profile"):
        PyTorchProfiler(record_shape=True)
    with pytest.raises(ConfigurationError, match=r"schedule=...\) received 5 \(type int\)"):
        PyTorchProfiler(schedule=5)  # type: ignore[arg-type]  # the wrong type is the point
    with pytest.raises(ConfigurationError, match="sort_by_key='cpu'"):
        PyTorchProfiler(sort_by_key="cpu")


def test_importing_profilers_loads_nothing_heavy():
    code = (
        "import sys, trainer.profilers; "
        "print('pstats' in sys.modules, 'trainer.profilers.pytorch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]  # the module is there, pstats is not


# --- PassThroughProfiler and resolve_profiler -----------------------------------------------


def test_pass_through_profiler_records_and_prints_nothing(tmp_path: Path, capsys):
    profiler = PassThroughProfiler(dirpath=tmp_path, filename="none")
    profiler.setup("fit")
    with profiler.profile("training_step") as name:
        time.sleep(0.001)
    profiler.describe()
    profiler.teardown("fit")

    assert name == "training_step"
    assert profiler.summary() == ""
    assert capsys.readouterr().out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, PassThroughProfiler),
        ("simple", SimpleProfiler),
        ("Advanced", AdvancedProfiler),
        ("PYTORCH", PyTorchProfiler),
    ],
)
def test_resolve_profiler_accepts_none_and_names(value, expected):
    assert type(resolve_profiler(value)) is expected


def test_resolve_profiler_passes_instances_through_and_dirpath_to_new_ones(tmp_path: Path):
    mine = AdvancedProfiler()
    assert resolve_profiler(mine) is mine
    assert resolve_profiler("simple", dirpath=str(tmp_path)).dirpath == str(tmp_path)


@pytest.mark.parametrize(
    ("value", "received", "fix"),
    [
        ("fast", "'fast' (type str)", 'Use e.g. Trainer(profiler="simple")'),
        ("simpel", "'simpel' (type str)", 'Did you mean "simple"?'),
        ("xla", "'xla' (type str)", 'use Trainer(profiler="pytorch")'),
        (True, "True (type bool)", "Trainer(profiler=SimpleProfiler())"),
        (SimpleProfiler, "(type ABCMeta)", "Pass an instance: Trainer(profiler=SimpleProfiler())"),
    ],
)
def test_resolve_profiler_error_names_the_argument_value_and_fix(value, received, fix):
    with pytest.raises(ConfigurationError) as info:
        resolve_profiler(value)
    message = str(info.value)
    assert message.startswith("Trainer(profiler=...) received ")
    assert received in message
    assert '"simple", "advanced" or "pytorch"' in message
    assert fix in message


def test_a_fits_pytorch_trace_still_records_each_batch_fetch(tmp_path: Path):
    # The prepared loader reads a plain loader itself (trainer/data/fetch.py) and makes torch's
    # per-batch DataLoader record only while a profiler runs: a trace keeps it.
    from tests.conftest import LinearModule, make_loader, quiet_trainer

    profiler = PyTorchProfiler(dirpath=tmp_path / "traces")
    run = quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=0, profiler=profiler)
    run.fit(LinearModule(), make_loader(32, 4))
    trace = tmp_path / "traces" / "fit-training_step.pt.trace.json"
    names = [event.get("name") for event in _trace_events(trace)]
    fetches = names.count("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
    steps = {name for name in names if str(name).startswith("ProfilerStep#")}
    assert len(steps) == 3 and fetches >= 3, (len(steps), fetches)
