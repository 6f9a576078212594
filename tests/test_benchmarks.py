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

from tests.conftest import make_loader, quiet_trainer
from trainer import Accelerator, TrainModule
from trainer.accelerator.optimizer import AcceleratedOptimizer
from trainer.callbacks.callback import Callback
from trainer.precision import Precision
from trainer.strategies.single import SingleDeviceStrategy

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
    # Failed before for raw (4 threads: its group outlived destroy_process_group, and a rank
    # aborted at exit in a CI run); every job ends its process group and the gloo threads.
    assert {
        name: [run["threads_left"] for run in runs] for name, runs in result["runs"].items()
    } == {name: [1] for name in result["runs"]}
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


def _raw_loop_reading_with(read: Any) -> Any:
    """bench_overhead's raw loop, its batches read by ``read(loader)`` instead of ``iter``."""
    from benchmarks import workload

    def run(dataset: Any, steps: int, workdir: str) -> None:
        net, loader = workload.build_net(), workload.build_loader(dataset)
        optimizer = workload.build_optimizer(net.parameters())
        for x, y in read(loader):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()

    return run


def test_a_quiet_trainer_step_makes_few_python_calls_beyond_a_raw_loop(tmp_path: Path) -> None:
    """#14's hot path, counted rather than timed (a count does not depend on the machine): a
    trainer_quiet step made 42 Python calls more than the raw loop's, 33 after the batch step
    read its hooks once per fit and skipped the calls that do nothing, 10 once the plain step
    (`BatchStep._is_plain`) ran inline and the Accelerator, the prepared optimizer and the
    loader stopped passing through calls that only pass the work on. What is left: the
    loader's generator, ``_train_batch``, ``step_batch``, ``accumulate`` (and its
    ``GradientState.advance``), the Accelerator's ``backward``, the prepared optimizer's
    ``step``, and the module's own ``training_step`` (whose ``self.net`` goes through
    ``nn.Module.__getattr__``). A hand-written Accelerator loop adds 4: the loader's generator,
    ``backward``, ``step`` and ``zero_grad``.

    Those counts are against a raw loop reading its batches as the prepared loader does
    (``trainer/data/fetch.py``); that reader itself makes about 19 calls a batch fewer than
    torch's iterator (its profiler record, made with no profiler running, and the calls around
    it), so against bench_overhead's raw loop both are below zero."""
    from benchmarks import bench_overhead
    from trainer.data.fetch import iterate

    def per_step(run: Any) -> float:
        _python_calls(run, 10, tmp_path)  # the first fit imports lazily: not a step's cost
        return (_python_calls(run, 300, tmp_path) - _python_calls(run, 100, tmp_path)) / 200

    raw = per_step(bench_overhead.run_raw)
    raw_reading_here = per_step(_raw_loop_reading_with(iterate))
    assert raw - raw_reading_here >= 15, (raw, raw_reading_here)  # 19
    assert abs(per_step(_raw_loop_reading_with(iter)) - raw) < 1  # the same loop as bench's
    extra = per_step(bench_overhead.run_trainer_quiet) - raw_reading_here
    assert 5 <= extra <= 11, extra  # 10, and a row every 50 steps
    accelerator = per_step(bench_overhead.run_accelerator) - raw_reading_here
    assert 2 <= accelerator <= 5, accelerator  # 4


# ---- the fast paths behind the call counts above: same results as the general paths --------
class _StepModule(TrainModule):
    """Returns a Tensor, a dict, or None (skip) by batch, so every branch of the step runs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if batch_idx == 2:
            return None
        return {"loss": loss} if batch_idx % 2 else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _BeforeBackward(Callback):
    """A hook between the step's parts: the fit takes the general path that calls it."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_backward(self, trainer: Any, module: Any, loss: torch.Tensor) -> None:
        self.calls += 1


class _PathSeen(Callback):
    """Records whether the fit's batches take the plain step (`BatchStep._is_plain`)."""

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.is_plain = trainer._fit_loop._is_plain


def _fit_steps(tmp_path: Path, callbacks: list[Any], accumulate: int) -> tuple[Any, ...]:
    module, seen = _StepModule(), _PathSeen()
    fit = quiet_trainer(
        tmp_path, max_epochs=2, callbacks=[seen, *callbacks], accumulate_grad_batches=accumulate
    )
    fit.fit(module, make_loader(n=40, batch_size=4))  # 10 batches: the last window is short
    params = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return seen.is_plain, params, fit.global_step, fit.optimizers[0].step_count


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_plain_step_trains_exactly_as_the_step_with_hooks(
    tmp_path: Path, accumulate: int
) -> None:
    hook = _BeforeBackward()
    is_plain, params, steps, stepped = _fit_steps(tmp_path / "plain", [], accumulate)
    was_plain, hooked_params, hooked_steps, hooked_stepped = _fit_steps(
        tmp_path / "hooked", [hook], accumulate
    )

    assert is_plain and not was_plain
    assert hook.calls == 2 * 9  # every batch but the skipped one, both epochs
    assert torch.equal(params, hooked_params)
    assert (steps, stepped) == (hooked_steps, hooked_stepped)


class _CountingStrategy(SingleDeviceStrategy):
    """A strategy that changes backward and the optimizer step: the Accelerator must call it."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.calls: list[str] = []

    def backward(self, loss: torch.Tensor, module: Any, **kwargs: Any) -> None:
        self.calls.append("backward")
        super().backward(loss, module, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        self.calls.append("step")
        return False  # reports a skipped step without stepping


class _CountingPrecision(Precision):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.calls.append("backward")
        super().backward(loss, **kwargs)


def _one_step(accelerator: Accelerator) -> tuple[torch.Tensor, AcceleratedOptimizer]:
    """One backward and optimizer step of a seeded Linear; its parameters after, and the
    prepared optimizer."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), optimizer


def test_the_accelerator_goes_through_a_strategy_or_precision_that_changes_a_step() -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    net(torch.ones(2, 4)).sum().backward()
    torch.optim.SGD(net.parameters(), lr=0.1).step()
    raw = torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    params, optimizer = _one_step(Accelerator(cpu=True))  # the base strategy and precision
    assert torch.equal(params, raw)
    assert optimizer.step_count == 1 and not optimizer.step_was_skipped

    strategy = _CountingStrategy()
    params, optimizer = _one_step(Accelerator(strategy=strategy))
    assert strategy.calls == ["backward", "step"]
    assert optimizer.step_was_skipped and optimizer.step_count == 0
    assert not torch.equal(params, raw)  # its step did not step

    precision = _CountingPrecision()
    params, _ = _one_step(Accelerator(cpu=True, mixed_precision=precision))
    assert precision.calls == ["backward"] and torch.equal(params, raw)
