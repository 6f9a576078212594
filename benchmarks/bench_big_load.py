"""Loading a ~1 GB sharded checkpoint: trainer's empty-weights path against load_file + load_state_dict.

A stack of fp32 ``nn.Linear(4096, 4096)`` layers (67 MB each; 15 of them by default, 1.007 GB)
is written once as safetensors shards of ~200 MB plus ``model.safetensors.index.json``. Each
variant then runs in a fresh subprocess, so its peak RSS (``VmHWM``, mapped file pages
included) is its own; rounds interleave the variants:

  trainer               with init_empty_weights(): model = build()
                        load_checkpoint_in_model(model, "model.safetensors.index.json")
  load_file             model = build()  (PyTorch's random init)
                        state = {}; for each shard: state.update(load_file(shard))
                        model.load_state_dict(state)
  load_file_per_shard   model = build(); for each shard: model.load_state_dict(load_file(shard),
                        strict=False)  (for reference: the frugal way to use load_file)

Times are wall clock for building the model, loading, and both. The page cache is warm (the
files are read once before the first round); ``MALLOC_MMAP_THRESHOLD_=1048576`` is set in every
subprocess so RSS follows live memory instead of glibc's growing mmap threshold. Targets:
trainer's total time <= 1.1x load_file's and peak RSS <= 0.6x. A checksum of the loaded weights
confirms the variants load the same numbers.

    python -m benchmarks.bench_big_load --rounds 3 [--layers 15] [--json big_load.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

VARIANTS = ("trainer", "load_file", "load_file_per_shard")
WIDTH = 4096
TARGETS = {"time_ratio": 1.1, "peak_ratio": 0.6}


def build(layers: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])


def write_checkpoint(directory: Path, layers: int) -> int:
    """Write the sharded checkpoint; return its size in bytes."""
    from trainer.big_modeling.api import init_empty_weights
    from trainer.checkpoint.format import write_model_files

    with init_empty_weights():
        model = build(layers)
    torch.manual_seed(0)
    state = {
        name: torch.randn(tuple(tensor.shape)) / WIDTH**0.5
        for name, tensor in model.state_dict().items()
    }
    write_model_files(directory, state, max_shard_size="200MB")
    return sum(t.numel() * t.element_size() for t in state.values())


def _status() -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status", encoding="ascii"))
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmHWM", "VmRSS")}


def worker(variant: str, directory: Path, layers: int) -> dict[str, Any]:
    """One measured load in this (fresh) process."""
    from safetensors.torch import load_file

    from trainer.big_modeling.api import init_empty_weights, load_checkpoint_in_model

    index = directory / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    imported = _status()
    start = time.perf_counter()
    if variant == "trainer":
        with init_empty_weights():
            model = build(layers)
        built = time.perf_counter()
        load_checkpoint_in_model(model, index, strict=True)
    else:
        model = build(layers)
        built = time.perf_counter()
        if variant == "load_file":
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(directory / shard))
            model.load_state_dict(state)
            del state
        else:
            for shard in shards:
                model.load_state_dict(load_file(directory / shard), strict=False)
    done = time.perf_counter()
    peak = _status()["VmHWM"]
    checksum = sum(float(p.detach().sum(dtype=torch.float64)) for p in model.parameters())
    return {
        "build_s": built - start,
        "load_s": done - built,
        "total_s": done - start,
        "peak_rss": peak,
        "rss_after_imports": imported["VmRSS"],
        "checksum": checksum,
    }


def _run_worker(variant: str, directory: Path, layers: int) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576"}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "benchmarks.bench_big_load", "--worker", variant]
    command += ["--dir", str(directory), "--layers", str(layers)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} worker failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(layers: int, rounds: int, directory: Path) -> dict[str, Any]:
    size = write_checkpoint(directory, layers)
    for file in directory.iterdir():  # warm the page cache: every variant reads from memory
        with open(file, "rb") as handle:
            while handle.read(64 * 2**20):
                pass
    samples: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            samples[variant].append(_run_worker(variant, directory, layers))
    summary: dict[str, Any] = {"checkpoint_bytes": size, "layers": layers, "rounds": rounds}
    for variant, runs in samples.items():
        summary[variant] = {
            key: statistics.median(run[key] for run in runs)
            for key in ("build_s", "load_s", "total_s", "peak_rss", "rss_after_imports")
        }
        summary[variant]["checksum"] = runs[0]["checksum"]
    ours, base = summary["trainer"], summary["load_file"]
    summary["ratios_vs_load_file"] = {
        "total_time": ours["total_s"] / base["total_s"],
        "load_time": ours["load_s"] / base["load_s"],
        "peak_rss": ours["peak_rss"] / base["peak_rss"],
        "peak_rss_above_imports": (ours["peak_rss"] - ours["rss_after_imports"])
        / (base["peak_rss"] - base["rss_after_imports"]),
    }
    summary["targets_met"] = {
        "time (total <= 1.1x)": summary["ratios_vs_load_file"]["total_time"]
        <= TARGETS["time_ratio"],
        "peak RSS (<= 0.6x)": summary["ratios_vs_load_file"]["peak_rss"] <= TARGETS["peak_ratio"],
    }
    summary["same_weights"] = len({round(summary[v]["checksum"], 3) for v in VARIANTS}) == 1
    return summary


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"checkpoint: {summary['checkpoint_bytes'] / 1e9:.3f} GB in ~200 MB shards, "
        f"{summary['layers']} x Linear({WIDTH}, {WIDTH}) fp32; median of {summary['rounds']} "
        "rounds, warm page cache, one fresh process per run",
        "",
        "| variant | build s | load s | total s | peak RSS MB | peak above imports MB |",
        "|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        figures = summary[variant]
        lines.append(
            f"| {variant} | {figures['build_s']:.3f} | {figures['load_s']:.3f} | "
            f"{figures['total_s']:.3f} | {figures['peak_rss'] / 1e6:.0f} | "
            f"{(figures['peak_rss'] - figures['rss_after_imports']) / 1e6:.0f} |"
        )
    ratios = summary["ratios_vs_load_file"]
    lines += [
        "",
        "trainer / load_file: total time {total_time:.2f}x, load time {load_time:.2f}x, peak RSS "
        "{peak_rss:.2f}x ({peak_rss_above_imports:.2f}x above imports)".format(**ratios),
        f"targets met: {summary['targets_met']}; same weights loaded: {summary['same_weights']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers", type=int, default=15, help="Linear(4096, 4096) layers (67 MB each)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the summary here")
    parser.add_argument("--worker", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, Path(args.dir), args.layers)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_big_load_") as directory:
        summary = run(args.layers, args.rounds, Path(directory))
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
