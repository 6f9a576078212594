"""Per-step overhead of ``Trainer``, Lightning, and hand-written Accelerator loops against raw PyTorch.

This script owns the overhead measurement and its report (a markdown table, optionally JSON). It
does not test correctness beyond one check that every variant ends with the same parameters.

Everything runs in one process on one CPU thread, with the workload of `benchmarks.workload`: a
2,762-parameter MLP (64→32→16→8→2, ReLU), 32 x ``--steps`` synthetic samples (seed 0) read by
``DataLoader(batch_size=32, shuffle=False)``, so one epoch is exactly ``--steps`` optimizer steps
of plain SGD (lr 0.05). The variants, each on a fresh model with the same seed, in pairs that do
the same thing in trainer and in the framework it is compared with (`benchmarks.frameworks`):

- ``raw``: ``for x, y in loader: opt.zero_grad(); loss = ...; loss.backward(); opt.step()``
- ``trainer_quiet`` / ``lightning_quiet``: ``Trainer.fit`` with logger, progress bar, model
  summary, checkpointing and sanity steps off, and no validation loader.
- ``trainer_logging`` / ``lightning_logging``: ``Trainer.fit`` whose ``training_step`` calls
  ``self.log("loss", loss, prog_bar=True)`` every step, with the defaults otherwise: the
  progress bar (trainer's RichProgressBar, Lightning's TQDM bar), the model summary and the
  checkpoint at the end of the epoch, plus a CSVLogger (``log_every_n_steps=50``); all files go
  to a temporary folder. The bars write to ``os.devnull`` unless ``--show-progress``: not a
  terminal, as in CI.
- ``accelerator`` / ``hf_accelerate``: ``Accelerator(cpu=True)``, ``prepare``, then
  ``accelerator.backward``, ``optimizer.step``, ``optimizer.zero_grad``: trainer's Accelerator,
  then Hugging Face Accelerate's.

The Lightning and Accelerate variants run when those packages are installed (``pip install -e
'.[dev]'``); ``--frameworks trainer`` leaves them out. Each round runs every variant once, the
order rotated by one each round, so machine drift hits all of them; ratios are taken against the
``raw`` run of the same round, and the tables give the minimum and the median over rounds. Two
spans are timed per run, each on two clocks: the wall clock (``time.perf_counter()``) and this
process's CPU time (``time.process_time()``, which leaves out time spent waiting for a core on a
busy machine).

- ``total``: everything after the model and the DataLoader exist:
  for a Trainer, ``Trainer(...)`` and the whole ``fit`` (setup, ``configure_optimizers``,
  teardown, CSV flush, checkpoint); for an Accelerator, ``Accelerator(...)``, ``prepare`` and the
  loop; for raw, building the optimizer and the loop.
- ``loop``: the training loop alone. For a Trainer, a callback reads the clocks at
  ``on_train_start`` and ``on_train_end``; for the others, around the ``for`` loop.

Before timing, one optimizer is built (torch 2.13 imports ``torch._dynamo``, ~1 s, the first
time any optimizer is created) and every variant runs once untimed (lazy imports: rich, yaml,
Lightning's and Accelerate's own).

Run: ``python -m benchmarks.bench_overhead --steps 2000 --rounds 5 --json overhead.json``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks import frameworks
from benchmarks.workload import (
    BATCH_SIZE,
    CLOCKS,
    RunTimes,
    build_dataset,
    build_loader,
    build_net,
    build_optimizer,
    flat_params,
    output_to,
    read_clocks,
    run_accelerator_loop,
)
from trainer import Accelerator, Trainer, TrainModule
from trainer.callbacks.callback import Callback

__all__ = ["BATCH_SIZE", "CLOCKS", "VARIANTS", "RunTimes", "main", "run_benchmark"]

# The targets: steps/s as a fraction of the raw loop's (None: measured, no target).
TARGETS: dict[str, float | None] = {
    "raw": None,
    "trainer_quiet": 0.97,
    "lightning_quiet": None,
    "trainer_logging": 0.95,
    "lightning_logging": None,
    "accelerator": 1.00,
    "hf_accelerate": None,
}
VARIANTS = tuple(TARGETS)
FRAMEWORK_OF = {
    "lightning_quiet": "lightning",
    "lightning_logging": "lightning",
    "hf_accelerate": "accelerate",
}


class _QuietModule(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(self.parameters())


class _LoggingModule(_QuietModule):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss


class _LoopTimer(Callback):
    """Reads the clock when the training loop starts and ends (setup and teardown excluded)."""

    def __init__(self) -> None:
        self.start = self.end = (0.0, 0.0)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.start = read_clocks()

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.end = read_clocks()


# ---- the variants -----------------------------------------------------------------------------
def run_raw(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    net, loader = build_net(), build_loader(dataset)
    start = read_clocks()
    optimizer = build_optimizer(net.parameters())
    loop_start = read_clocks()
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
    end = read_clocks()
    return RunTimes(start, loop_start, end, end, flat_params(net))


def _run_trainer(
    module: TrainModule, dataset: TensorDataset, steps: int, **options: Any
) -> RunTimes:
    loader, timer = build_loader(dataset), _LoopTimer()
    start = read_clocks()
    trainer = Trainer(
        max_epochs=1, max_steps=steps, accelerator="cpu", callbacks=[timer], **options
    )
    trainer.fit(module, loader)
    end = read_clocks()
    if trainer.global_step != steps:
        raise RuntimeError(f"Trainer took {trainer.global_step} steps, expected {steps}")
    return RunTimes(start, timer.start, timer.end, end, flat_params(module.net))


def run_trainer_quiet(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    return _run_trainer(
        _QuietModule(),
        dataset,
        steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=workdir,
    )


def run_trainer_logging(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    # The defaults (bar, summary, a checkpoint at the end) with a CSVLogger, as Lightning's.
    return _run_trainer(
        _LoggingModule(), dataset, steps, log_every_n_steps=50, default_root_dir=workdir
    )


def run_accelerator(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    return run_accelerator_loop(Accelerator, dataset)


# Each runner takes (dataset, steps, a temporary folder it may write into).
RUNNERS: dict[str, Callable[[TensorDataset, int, str], RunTimes]] = {
    "raw": run_raw,
    "trainer_quiet": run_trainer_quiet,
    "lightning_quiet": frameworks.run_lightning_quiet,
    "trainer_logging": run_trainer_logging,
    "lightning_logging": frameworks.run_lightning_logging,
    "accelerator": run_accelerator,
    "hf_accelerate": frameworks.run_hf_accelerate,
}


# ---- measuring --------------------------------------------------------------------------------
_stdout_to = output_to  # the name bench_loggers imports


def _run_once(name: str, dataset: TensorDataset, steps: int, sink: str | None) -> RunTimes:
    gc.collect()
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory(prefix=f"bench_{name}_") as workdir, output_to(sink):
            return RUNNERS[name](dataset, steps, workdir)
    finally:
        torch.set_num_threads(threads)  # a framework may change it; the next run gets the same


def select_variants(frameworks_wanted: str = "all") -> tuple[str, ...]:
    """The variants to run: trainer's and raw, plus Lightning's and Accelerate's when installed.

    ``frameworks_wanted="trainer"`` leaves the other frameworks out.
    """
    return tuple(
        name
        for name in VARIANTS
        if name not in FRAMEWORK_OF
        or (frameworks_wanted == "all" and frameworks.is_available(FRAMEWORK_OF[name]))
    )


def rotated(names: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    """``names`` starting at position ``round_index``: each variant takes each slot in turn."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def run_benchmark(
    *,
    steps: int,
    rounds: int,
    threads: int = 1,
    show_progress: bool = False,
    frameworks_wanted: str = "all",
) -> dict[str, Any]:
    """Run every variant ``rounds`` times, interleaved; return the figures as a JSON-able dict."""
    torch.set_num_threads(threads)
    load_at_start = _load_average()
    build_optimizer(build_net().parameters())  # pay torch 2.13's one-time torch._dynamo import
    sink = None if show_progress else os.devnull
    names = select_variants(frameworks_wanted)
    warmup = build_dataset(min(steps, 50))
    for name in names:  # untimed: lazy imports (rich, yaml, the frameworks) and first calls
        _run_once(name, warmup, len(warmup) // BATCH_SIZE, sink)
    dataset = build_dataset(steps)
    per_round: list[dict[str, RunTimes]] = []
    for index in range(rounds):
        per_round.append(
            {name: _run_once(name, dataset, steps, sink) for name in rotated(names, index)}
        )
    result = _summarize(per_round, names, steps=steps, rounds=rounds, threads=threads)
    result["config"]["load_average_start"] = load_at_start
    return result


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    """The version of each framework that ran."""
    import importlib.metadata

    found = {"trainer": importlib.metadata.version("trainer")}
    for name in names:
        package = FRAMEWORK_OF.get(name, "lightning" if name.startswith("lightning_") else None)
        if package is not None:
            found[package] = importlib.metadata.version(package)
    return found


def _load_average() -> list[float] | None:
    """1-, 5- and 15-minute load averages (None where the OS has none), to judge the noise."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


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
        runs = [times[name] for times in per_round]
        variants[name] = {
            clock: _clock_figures(per_round, name, CLOCKS.index(clock), steps) for clock in CLOCKS
        }
        variants[name]["max_abs_param_diff_vs_raw"] = max(
            float((run.params - reference).abs().max()) for run in runs
        )
        variants[name]["target_ratio"] = TARGETS[name]
    return {
        "config": {
            "steps": steps,
            "rounds": rounds,
            "threads": threads,
            "batch_size": BATCH_SIZE,
            "parameters": sum(p.numel() for p in build_net().parameters()),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(),
            "load_average_end": _load_average(),
            "versions": _versions(names),
        },
        "variants": variants,
    }


def _clock_figures(
    per_round: list[dict[str, RunTimes]], name: str, clock: int, steps: int
) -> dict[str, Any]:
    """Median speeds and min/median ratios against the same round's raw run, on one clock."""
    runs = [times[name] for times in per_round]
    totals = [run.total_s(clock) for run in runs]
    loops = [run.loop_s(clock) for run in runs]
    total_ratios = [times["raw"].total_s(clock) / times[name].total_s(clock) for times in per_round]
    loop_ratios = [times["raw"].loop_s(clock) / times[name].loop_s(clock) for times in per_round]
    return {
        "steps_per_s": [steps / total for total in totals],
        "steps_per_s_median": statistics.median(steps / total for total in totals),
        "ratio_min": min(total_ratios),
        "ratio_median": statistics.median(total_ratios),
        "loop_steps_per_s_median": statistics.median(steps / loop for loop in loops),
        "loop_us_per_step_median": statistics.median(1e6 * loop / steps for loop in loops),
        "loop_ratio_min": min(loop_ratios),
        "loop_ratio_median": statistics.median(loop_ratios),
        "setup_ms_median": statistics.median(
            1e3 * (total - loop) for total, loop in zip(totals, loops)
        ),
    }


# ---- reporting --------------------------------------------------------------------------------
def _verdict(target: float | None, ratio: float) -> str:
    if target is None:
        return "—"
    return f"≥ {target:.2f}x: {'met' if ratio >= target else 'NOT met'}"


def format_table(result: dict[str, Any]) -> str:
    """Markdown tables (wall clock, then CPU time): median steps/s and min-median ratios."""
    config = result["config"]
    lines = [
        f"{config['parameters']:,}-parameter MLP, batch {config['batch_size']}, "
        f"{config['steps']:,} steps, {config['rounds']} rounds, {config['threads']} thread(s), "
        f"torch {config['torch']}, {config['cpu_count']} CPUs, load average (1/5/15 min) "
        f"{config['load_average_start']} at the start, {config['load_average_end']} at the end; "
        + ", ".join(f"{name} {version}" for name, version in config["versions"].items()),
    ]
    for clock, title in zip(CLOCKS, ("Wall clock (perf_counter)", "CPU time (process_time)")):
        lines += [
            "",
            f"{title}:",
            "",
            "| variant | steps/s, whole fit | ratio vs raw, min-median | loop steps/s | "
            "loop µs/step | loop ratio, min-median | setup ms | target (median ratio, "
            "whole fit) |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, figures in result["variants"].items():
            row = figures[clock]
            lines.append(
                f"| {name} | {row['steps_per_s_median']:,.0f} | "
                f"{row['ratio_min']:.3f}-{row['ratio_median']:.3f} | "
                f"{row['loop_steps_per_s_median']:,.0f} | {row['loop_us_per_step_median']:.1f} | "
                f"{row['loop_ratio_min']:.3f}-{row['loop_ratio_median']:.3f} | "
                f"{row['setup_ms_median']:.1f} | "
                f"{_verdict(figures['target_ratio'], row['ratio_median'])} |"
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
        "--show-progress",
        action="store_true",
        help="leave stdout and stderr alone during runs (on a terminal the live bars draw)",
    )
    parser.add_argument(
        "--frameworks",
        choices=("all", "trainer"),
        default="all",
        help="all: also Lightning and Accelerate where installed; trainer: raw and trainer only",
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
        show_progress=args.show_progress,
        frameworks_wanted=args.frameworks,
    )
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
