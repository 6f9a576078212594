"""Per-step cost of ``self.log`` every step with all four loggers, against a raw PyTorch loop.

This script owns the logger overhead measurement and its report (markdown tables, optionally
JSON). The model, data, raw loop, clocks and per-round ratios are those of
``benchmarks/bench_overhead.py`` (imported, not copied): a 2,762-parameter MLP, batch 32, one
epoch of exactly ``--steps`` SGD steps, one process on one CPU thread. The variants, each on a
fresh model with the same seed:

- ``raw``: the hand-written loop of bench_overhead.
- ``trainer_no_logger``: ``Trainer.fit`` whose ``training_step`` calls ``self.log("loss", loss,
  prog_bar=True)`` every step, with ``logger=False`` (the metric still reaches
  ``callback_metrics``).
- ``trainer_csv``: the same with ``CSVLogger``.
- ``trainer_all_loggers``: the same with ``CSVLogger``, ``TensorBoardLogger``, ``WandbLogger``
  (offline) and ``MLFlowLogger`` (a sqlite store) at once.
- ``lightning_no_logger`` and ``lightning_all_loggers``: the same two runs with
  ``lightning.pytorch.Trainer`` and Lightning's own four loggers (`benchmarks.frameworks`),
  when Lightning is installed.

Every Trainer variant (trainer's and Lightning's) uses ``log_every_n_steps=50``, no progress bar, no model summary, no
checkpointing and no sanity steps (measured by bench_overhead and bench_checkpoint), and a
module with one hyperparameter, so each tracker starts its run in ``fit``'s setup (as in real
use) rather than inside the loop. Rounds are interleaved, in a rotated order each round, so
machine drift hits every variant; ratios are against the same round's ``raw`` run.

- ``loop``: from ``on_train_start`` to ``on_train_end``: the per-step cost, the figure the
  target (>= 0.93x the raw loop's steps/s, trainer's variants) is about.
- ``total``: ``Trainer(...)`` and the whole ``fit``: adds each tracker's one-time start (wandb's
  service and run, MLflow's run) and finish (the last writes, closing the runs), shown as
  ``setup + teardown ms``.

wandb runs offline with its files, cache and config in a temporary folder (``WANDB_*``
variables are set for this process). The MLflow database is created, and every backend imported,
during an untimed warm-up.

Run: ``python -m benchmarks.bench_loggers --steps 2000 --rounds 5 --json loggers.json``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import TensorDataset

from benchmarks import frameworks
from benchmarks.bench_overhead import (
    BATCH_SIZE,
    CLOCKS,
    RunTimes,
    _clock_figures,
    _load_average,
    _LoggingModule,
    _run_trainer,
    _stdout_to,
    _versions,
    build_dataset,
    build_net,
    build_optimizer,
    run_raw,
)
from trainer.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

__all__ = ["VARIANTS", "main", "run_benchmark"]

VARIANTS = (
    "raw",
    "trainer_no_logger",
    "trainer_csv",
    "trainer_all_loggers",
    "lightning_no_logger",
    "lightning_all_loggers",
)
TARGET_LOOP_RATIO = 0.93  # trainer's steps/s in the training loop, as a fraction of the raw loop's
LOG_EVERY_N_STEPS = 50


class _HparamsLoggingModule(_LoggingModule):
    """bench_overhead's logging module, plus one hyperparameter for the trackers to record."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()


def _all_loggers(workdir: str, tracking_uri: str) -> list[Logger]:
    return [
        CSVLogger(os.path.join(workdir, "csv")),
        TensorBoardLogger(os.path.join(workdir, "tb")),
        WandbLogger(project="bench", save_dir=os.path.join(workdir, "wandb"), offline=True),
        MLFlowLogger(experiment_name="bench", tracking_uri=tracking_uri),
    ]


def _make_runners(tracking_uri: str) -> dict[str, Callable[[TensorDataset, int, str], RunTimes]]:
    """Each runner takes (dataset, steps, a temporary folder it may write into)."""

    def trainer_run(loggers: Callable[[str], Any]) -> Callable[[TensorDataset, int, str], RunTimes]:
        def run(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
            return _run_trainer(
                _HparamsLoggingModule(),
                dataset,
                steps,
                logger=loggers(workdir),
                log_every_n_steps=LOG_EVERY_N_STEPS,
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                num_sanity_val_steps=0,
                default_root_dir=workdir,
            )

        return run

    def lightning_run(
        loggers: Callable[[str], Any],
    ) -> Callable[[TensorDataset, int, str], RunTimes]:
        def run(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
            return frameworks.run_lightning(
                dataset,
                steps,
                is_logging=True,
                hparams=True,
                logger=loggers(workdir),
                log_every_n_steps=LOG_EVERY_N_STEPS,
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                num_sanity_val_steps=0,
                default_root_dir=workdir,
            )

        return run

    return {
        "raw": run_raw,
        "trainer_no_logger": trainer_run(lambda workdir: False),
        "trainer_csv": trainer_run(lambda workdir: CSVLogger(workdir)),
        "trainer_all_loggers": trainer_run(lambda workdir: _all_loggers(workdir, tracking_uri)),
        "lightning_no_logger": lightning_run(lambda workdir: False),
        "lightning_all_loggers": lightning_run(
            lambda workdir: frameworks.lightning_loggers(workdir, tracking_uri)
        ),
    }


def _variants(frameworks_wanted: str) -> tuple[str, ...]:
    """Trainer's variants, and Lightning's when installed and wanted."""
    has_lightning = frameworks_wanted == "all" and frameworks.is_available("lightning")
    return tuple(name for name in VARIANTS if has_lightning or not name.startswith("lightning"))


def _no_logger_of(name: str) -> str:
    """The run without a logger of the same framework: what a logger's own share is taken from."""
    return "lightning_no_logger" if name.startswith("lightning") else "trainer_no_logger"


@contextlib.contextmanager
def _offline_wandb(folder: str) -> Any:
    """wandb offline and quiet, its files under ``folder``; the environment restored after."""
    values = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": os.path.join(folder, "wandb_dir"),
        "WANDB_CACHE_DIR": os.path.join(folder, "wandb_cache"),
        "WANDB_CONFIG_DIR": os.path.join(folder, "wandb_config"),
        "WANDB_DATA_DIR": os.path.join(folder, "wandb_data"),
    }
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_benchmark(
    *, steps: int, rounds: int, threads: int = 1, frameworks_wanted: str = "all"
) -> dict[str, Any]:
    """Run every variant ``rounds`` times, interleaved; return the figures as a JSON-able dict."""
    names = _variants(frameworks_wanted)
    torch.set_num_threads(threads)
    load_at_start = _load_average()
    build_optimizer(build_net().parameters())  # pay torch 2.13's one-time torch._dynamo import
    with tempfile.TemporaryDirectory(prefix="bench_loggers_") as root, _offline_wandb(root):
        tracking_uri = f"sqlite:///{os.path.join(root, 'mlflow.db')}"
        runners = _make_runners(tracking_uri)
        warmup = build_dataset(min(steps, 2 * LOG_EVERY_N_STEPS))
        for name in names:  # untimed: imports, wandb's service, MLflow's schema
            _run_once(runners[name], warmup, len(warmup) // BATCH_SIZE)
        dataset = build_dataset(steps)
        per_round: list[dict[str, RunTimes]] = []
        for index in range(rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            per_round.append({name: _run_once(runners[name], dataset, steps) for name in order})
        call_costs = measure_call_costs(root, tracking_uri)
    return _summarize(per_round, names, steps=steps, rounds=rounds, threads=threads) | {
        "load_average_start": load_at_start,
        "load_average_end": _load_average(),
        "log_metrics_call_us": call_costs,
    }


def measure_call_costs(root: str, tracking_uri: str, calls: int = 200) -> dict[str, Any]:
    """Mean cost of one ``log_metrics({"loss", "epoch"}, step)`` call of each logger.

    Each logger's run is started first (untimed); the calls are timed one by one on the calling
    thread's CPU clock (``time.thread_time``: the caller's share, without the loggers' own
    background threads) and on the wall clock. The mean includes the periodic writes (CSV's
    file every 100 steps); MLflow's buffered metrics wait for ``save()``, timed separately.
    """
    costs: dict[str, Any] = {}
    for logger in _all_loggers(os.path.join(root, "calls"), tracking_uri):
        logger.log_hyperparams({"lr": 0.05})
        cpu, wall = [], []
        for step in range(calls):
            start_cpu, start_wall = time.thread_time(), time.perf_counter()
            logger.log_metrics({"loss": 1.0 / (step + 1), "epoch": 0.0}, step * LOG_EVERY_N_STEPS)
            cpu.append(time.thread_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
        start_wall = time.perf_counter()
        logger.save()
        flush_ms = 1e3 * (time.perf_counter() - start_wall)
        logger.finalize("success")
        costs[type(logger).__name__] = {
            "cpu_us_mean": 1e6 * statistics.fmean(cpu),
            "wall_us_mean": 1e6 * statistics.fmean(wall),
            "save_ms": flush_ms,
        }
    return costs


def _run_once(
    runner: Callable[[TensorDataset, int, str], RunTimes], dataset: TensorDataset, steps: int
) -> RunTimes:
    gc.collect()
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory(prefix="bench_run_") as workdir, _stdout_to(os.devnull):
            return runner(dataset, steps, workdir)
    finally:
        torch.set_num_threads(threads)


def _summarize(
    per_round: list[dict[str, RunTimes]],
    names: tuple[str, ...],
    *,
    steps: int,
    rounds: int,
    threads: int,
) -> dict[str, Any]:
    reference = per_round[0]["raw"].params
    variants: dict[str, Any] = {}
    for name in names:
        figures: dict[str, Any] = {
            clock: _clock_figures(per_round, name, CLOCKS.index(clock), steps) for clock in CLOCKS
        }
        for clock in CLOCKS:  # the loggers' own share: against the same Trainer without one
            index = CLOCKS.index(clock)
            figures[clock]["loop_ratio_vs_no_logger_median"] = statistics.median(
                times[_no_logger_of(name)].loop_s(index) / times[name].loop_s(index)
                for times in per_round
            )
        figures["max_abs_param_diff_vs_raw"] = max(
            float((times[name].params - reference).abs().max()) for times in per_round
        )
        variants[name] = figures
    return {
        "config": {
            "steps": steps,
            "rounds": rounds,
            "threads": threads,
            "batch_size": BATCH_SIZE,
            "log_every_n_steps": LOG_EVERY_N_STEPS,
            "parameters": sum(p.numel() for p in build_net().parameters()),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(),
            "target_loop_ratio": TARGET_LOOP_RATIO,
            "versions": _versions(names),
        },
        "variants": variants,
    }


def format_table(result: dict[str, Any]) -> str:
    """Markdown tables (wall clock, then CPU time): loop ratios are the per-step figures."""
    config = result["config"]
    lines = [
        f"{config['parameters']:,}-parameter MLP, batch {config['batch_size']}, "
        f"{config['steps']:,} steps, log_every_n_steps={config['log_every_n_steps']}, "
        f"{config['rounds']} rounds, {config['threads']} thread(s), torch {config['torch']}, "
        f"{config['cpu_count']} CPUs, load average (1/5/15 min) {result['load_average_start']} "
        f"at the start, {result['load_average_end']} at the end; "
        + ", ".join(f"{name} {version}" for name, version in config["versions"].items()),
    ]
    for clock, title in zip(CLOCKS, ("Wall clock (perf_counter)", "CPU time (process_time)")):
        lines += [
            "",
            f"{title}:",
            "",
            "| variant | loop µs/step | loop ratio vs raw, min-median | loop ratio vs "
            "no logger, median | whole fit ratio, median | setup + teardown ms | target "
            f"(loop ≥ {config['target_loop_ratio']:.2f}x raw) |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for name, figures in result["variants"].items():
            row = figures[clock]
            verdict = "—"
            if name.startswith("trainer"):
                is_met = row["loop_ratio_median"] >= config["target_loop_ratio"]
                verdict = "met" if is_met else "NOT met"
            lines.append(
                f"| {name} | {row['loop_us_per_step_median']:.1f} | "
                f"{row['loop_ratio_min']:.3f}-{row['loop_ratio_median']:.3f} | "
                f"{row['loop_ratio_vs_no_logger_median']:.3f} | {row['ratio_median']:.3f} | "
                f"{row['setup_ms_median']:.0f} | {verdict} |"
            )
    lines += [
        "",
        "One log_metrics call with 2 metrics, run already started (mean of 200 calls):",
        "",
        "| logger | CPU µs/call | wall µs/call | µs/step at log_every_n_steps="
        f"{config['log_every_n_steps']} (CPU) | save() ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, cost in result["log_metrics_call_us"].items():
        per_step = cost["cpu_us_mean"] / config["log_every_n_steps"]
        lines.append(
            f"| {name} | {cost['cpu_us_mean']:.1f} | {cost['wall_us_mean']:.1f} | "
            f"{per_step:.2f} | {cost['save_ms']:.1f} |"
        )
    worst = max(figures["max_abs_param_diff_vs_raw"] for figures in result["variants"].values())
    lines += ["", f"Largest final-parameter difference from the raw loop: {worst:.3g}"]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--frameworks",
        choices=("all", "trainer"),
        default="all",
        help="all: also Lightning where installed; trainer: raw and trainer only",
    )
    args = parser.parse_args(argv)
    for option in ("steps", "rounds", "threads"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} expects an int >= 1, received {getattr(args, option)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    result = run_benchmark(
        steps=args.steps,
        rounds=args.rounds,
        threads=args.threads,
        frameworks_wanted=args.frameworks,
    )
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
