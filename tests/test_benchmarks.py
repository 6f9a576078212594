"""Smoke tests of benchmarks/: each script runs end to end and reports what it promises.

They run the scripts as a user would (``python -m benchmarks.<name>``) with the smallest
settings and check the printed report and the JSON's keys and signs. They never assert on speed:
a shared CI machine makes any threshold flaky, and the figures belong in docs/performance.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = (
    "raw",
    "trainer_quiet",
    "lightning_quiet",
    "trainer_logging",
    "lightning_logging",
    "accelerator",
    "hf_accelerate",
)
CLOCK_KEYS = (
    "steps_per_s_median",
    "ratio_min",
    "ratio_median",
    "loop_steps_per_s_median",
    "loop_us_per_step_median",
    "loop_ratio_min",
    "loop_ratio_median",
)


def run_module(module: str, *args: str) -> str:
    """Run ``python -m module args`` from the repository root; return its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{module} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def is_positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_bench_overhead_reports_every_variant(tmp_path: Path) -> None:
    path = tmp_path / "overhead.json"
    out = run_module(
        "benchmarks.bench_overhead", "--steps", "50", "--rounds", "1", "--json", str(path)
    )

    result = json.loads(path.read_text(encoding="utf-8"))
    assert result["config"]["steps"] == 50
    assert result["config"]["rounds"] == 1
    assert result["config"]["parameters"] == 2762
    assert set(result["variants"]) == set(VARIANTS)
    for name in VARIANTS:
        figures = result["variants"][name]
        for clock in ("wall", "cpu"):
            for key in CLOCK_KEYS:
                assert is_positive(figures[clock][key]), (name, clock, key, figures[clock][key])
            assert len(figures[clock]["steps_per_s"]) == 1
        # Same seed, same data, same optimizer: the benchmark compares equal work.
        assert figures["max_abs_param_diff_vs_raw"] <= 1e-6, name
        assert out.count(f"| {name} |") == 2  # one row in the wall table, one in the CPU table
    assert result["variants"]["raw"]["wall"]["ratio_median"] == pytest.approx(1.0)
    assert result["variants"]["trainer_quiet"]["target_ratio"] == 0.97
    assert result["variants"]["trainer_logging"]["target_ratio"] == 0.95
    assert result["variants"]["accelerator"]["target_ratio"] == 1.00
    assert set(result["config"]["versions"]) == {"trainer", "lightning", "accelerate"}


@pytest.mark.slow
def test_bench_import_reports_times_and_modules(tmp_path: Path) -> None:
    path = tmp_path / "import.json"
    out = run_module("benchmarks.bench_import", "--runs", "1", "--json", str(path))

    result = json.loads(path.read_text(encoding="utf-8"))
    assert result["runs"] == 1
    for key in ("import_torch_median_s", "import_torch_trainer_median_s"):
        assert is_positive(result[key]), key
    assert is_positive(result["import_trainer_in_process_median_s"])
    # The delta may be negative on a noisy machine; it only has to be a number.
    assert isinstance(result["delta_median_s"], float)
    assert set(result["target_met"]) == {"wall", "cpu", "in_process"}
    assert all(isinstance(value, bool) for value in result["target_met"].values())
    modules = result["modules"]
    assert set(modules) >= {"by_torch", "by_trainer", "added_count", "added_outside_trainer"}
    assert modules["added_count"] > 0  # trainer's own modules at least
    assert "import trainer over import torch" in out
    assert "optional modules loaded by `import trainer`" in out


@pytest.mark.slow
def test_bench_async_checkpoint_reports_blocked_time_per_save(tmp_path: Path) -> None:
    path = tmp_path / "async.json"
    out = run_module(
        "benchmarks.bench_async_checkpoint",
        *("--params", "1e6", "--steps", "6", "--every", "2", "--rounds", "1"),
        *("--json", str(path)),
    )

    result = json.loads(path.read_text(encoding="utf-8"))
    assert set(result["summary"]) == {"none", "sync", "async"}
    for variant in ("sync", "async"):
        (run,) = result["runs"][variant]
        assert len(run["blocked_s"]) == 3 and all(is_positive(s) for s in run["blocked_s"])
        assert is_positive(result["summary"][variant]["blocked_median_s"])
    assert is_positive(result["runs"]["async"][0]["snapshot_s_last"])
    assert "of a synchronous save (median per save)" in out


@pytest.mark.slow
def test_bench_checkpoint_reports_trainer_beside_raw_lightning_and_accelerate(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    out = run_module(
        "benchmarks.bench_checkpoint",
        *("--params", "3e4", "--width", "128", "--rounds", "1", "--json", str(path)),
    )

    result = json.loads(path.read_text(encoding="utf-8"))
    assert result["params"] == 2 * (128 * 128 + 128) and result["digest"] == "sha256"
    for kind in ("save", "load"):
        for name in ("trainer", "safetensors", "Lightning", "Accelerate"):
            values = next(v for k, v in result["times"].items() if k.startswith(f"{kind} {name}"))
            assert len(values) == 1 and is_positive(values[0]), (kind, name)
        ratio = result["ratios"][kind]
        assert is_positive(ratio["median"]) and ratio["min"] <= ratio["median"]
        assert ratio["target"] == {"save": 0.9, "load": 0.8}[kind]
    assert "| save: save safetensors+fsync |" in out


@pytest.mark.slow
def test_bench_gpu_skips_without_cuda_and_runs_its_code_on_the_cpu(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    if not torch.cuda.is_available():
        out = run_module("benchmarks.bench_gpu", "--json", str(path))
        assert "skipped, CUDA is not available" in out
        assert json.loads(path.read_text(encoding="utf-8")) == {"skipped": "CUDA is not available"}
    out = run_module(
        "benchmarks.bench_gpu",
        *("--device", "cpu", "--config", "tiny", "--steps", "2", "--warmup", "1"),
        *("--rounds", "1", "--json", str(path)),
    )
    result = json.loads(path.read_text(encoding="utf-8"))
    assert set(result["variants"]) == {"raw", "trainer", "lightning"}
    for name, figures in result["variants"].items():
        assert is_positive(figures["tokens_per_s_median"]), name
        assert figures["peak_mb_max"] is None  # measured on CUDA only
    assert "| trainer |" in out


@pytest.mark.slow
def test_bench_launch_reports_each_phase_of_each_job(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    out = run_module("benchmarks.bench_launch", "--rounds", "1", "--no-warmup", "--json", str(path))
    result = json.loads(path.read_text(encoding="utf-8"))
    assert set(result["median"]) == {"raw", "torchrun+trainer", "trainer launch"}
    for name, marks in result["median"].items():
        times = [marks[phase] for phase in ("script", "imports", "group", "first_step", "fit_end")]
        assert all(is_positive(t) for t in times) and times == sorted(times), name
        assert marks["exit"] >= marks["fit_end"], name
    assert "| trainer launch |" in out


def test_run_all_names_every_benchmark_with_its_json(tmp_path: Path) -> None:
    from benchmarks import run_all

    for name in run_all.BENCHMARKS:
        full = run_all.command_of(name, is_quick=False, out=tmp_path)
        quick = run_all.command_of(name, is_quick=True, out=tmp_path)
        assert full != quick and any("bench_" in part for part in full), name
        if name in run_all.HAS_JSON:
            assert full[-2:] == ["--json", str(tmp_path / f"{name}.json")]
    assert run_all.main(["--only", "gpu", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "gpu.md").read_text(encoding="utf-8")


def _python_calls(run: Any, steps: int, tmp_path: Path) -> int:
    """Python function calls (profile 'call' events) of one bench_overhead run of ``steps``."""
    from benchmarks import workload

    dataset = workload.build_dataset(steps)
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        run(dataset, steps, str(tmp_path))
    finally:
        sys.setprofile(None)
    return count


def test_a_quiet_trainer_step_makes_few_python_calls_beyond_a_raw_loop(tmp_path: Path) -> None:
    """#14's hot path, counted rather than timed (a count does not depend on the machine): a
    trainer_quiet step made 42 Python calls more than the raw loop's, 33 after the batch step
    read its hooks once per fit and skipped the calls that do nothing."""
    from benchmarks import bench_overhead

    def per_step(run: Any) -> float:
        _python_calls(run, 10, tmp_path)  # the first fit imports lazily: not a step's cost
        return (_python_calls(run, 300, tmp_path) - _python_calls(run, 100, tmp_path)) / 200

    extra = per_step(bench_overhead.run_trainer_quiet) - per_step(bench_overhead.run_raw)
    assert 20 <= extra <= 36, extra
