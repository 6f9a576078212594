"""Checkpoint save/load speed: trainer's format against raw safetensors, Lightning and Accelerate.

One process, a ~100M-parameter fp32 model (``--params``; 100,687,872 parameters, 403 MB, in
``Linear(4096, 4096)`` layers; ``--width`` changes their size). Each round times every save,
then every load, the order rotated by one each round:

  save: ``trainer.checkpoint.write_checkpoint`` (safetensors + digests while writing +
        fsync + manifest + atomic rename, replacing the previous round's checkpoint);
        ``safetensors.torch.save_file`` + fsync (the reference), and without the fsync;
        Lightning ``Fabric.save`` (``torch.save``); Accelerate ``save_state`` (safetensors).
  load: ``trainer.checkpoint.read_checkpoint`` (every byte checked against its digest first) +
        ``load_state_dict``; ``safetensors.torch.load_file`` + ``load_state_dict`` (the
        reference); Lightning ``Fabric.load``; Accelerate ``load_state``.

Lightning and Accelerate neither fsync nor check a digest; they run when installed. Before each
timed operation ``os.sync()`` and ``gc.collect()`` run, untimed, so no operation pays for another's
dirty pages. Files are on one disk (``BENCH_DIR`` picks the folder); loads read the page cache,
warm after the first round. Ratios are taken per round (reference time / trainer time, so > 1
means trainer is faster) and given as min-median over rounds. Targets: save >= 0.9x raw
safetensors + fsync, load >= 0.8x raw safetensors.

Digests are sha256 (the default) unless ``--digest blake3`` (``TRAINER_CHECKPOINT_DIGEST``).

    python benchmarks/bench_checkpoint.py --rounds 7 [--params 100e6] [--digest blake3]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trainer.checkpoint import read_checkpoint, write_checkpoint
from trainer.checkpoint.tensor_files import default_digest

__all__ = ["TARGETS", "build_model", "main", "run"]

TARGETS = {"save": ("save trainer", "save safetensors+fsync", 0.9), "load": ("load trainer", "load safetensors", 0.8)}  # fmt: skip


def build_model(params: float, width: int = 4096) -> torch.nn.Module:
    """A stack of ``Linear(width, width)`` layers with about ``params`` parameters."""
    layers = max(1, round(params / (width * width + width)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _timed(function: Callable[[], object]) -> float:
    os.sync()  # no dirty pages left by the previous operation
    gc.collect()
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _operations(
    model: torch.nn.Module, target: torch.nn.Module, directory: str, *, with_frameworks: bool
) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    """The save and the load operations, by name; each load reads what its save wrote."""
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    ours, raw = os.path.join(directory, "ck"), os.path.join(directory, "raw.safetensors")
    saves: dict[str, Callable[[], object]] = {
        "save trainer": lambda: write_checkpoint(ours, {"state_dict": state}),
        "save safetensors+fsync": lambda: (save_file(state, raw), _fsync(raw)),
        "save safetensors": lambda: save_file(state, raw + ".nofsync"),
    }
    loads: dict[str, Callable[[], object]] = {
        "load trainer": lambda: target.load_state_dict(read_checkpoint(ours)["state_dict"]),
        "load safetensors": lambda: target.load_state_dict(load_file(raw)),
    }
    if with_frameworks and _is_installed("lightning"):
        from lightning.fabric import Fabric

        fabric, lightning_file = (
            Fabric(accelerator="cpu", devices=1),
            os.path.join(directory, "l.ckpt"),
        )
        saves["save Lightning Fabric.save"] = lambda: fabric.save(lightning_file, {"model": model})
        loads["load Lightning Fabric.load"] = lambda: fabric.load(lightning_file, {"model": target})
    if with_frameworks and _is_installed("accelerate"):
        from accelerate import Accelerator

        accelerator, accelerate_dir = Accelerator(cpu=True), os.path.join(directory, "accelerate")
        accelerator.prepare(
            model
        )  # save_state writes the prepared models; load_state reads them back
        saves["save Accelerate save_state"] = lambda: accelerator.save_state(accelerate_dir)
        loads["load Accelerate load_state"] = lambda: accelerator.load_state(accelerate_dir)
    return saves, loads


def _rotated(names: list[str], index: int) -> list[str]:
    shift = index % len(names)
    return names[shift:] + names[:shift]


def run(
    params: float, rounds: int, directory: str, *, width: int = 4096, with_frameworks: bool = True
) -> tuple[dict[str, list[float]], int]:
    """Seconds of every operation in every round (after one untimed round that warms up), and
    the model's parameter count."""
    torch.manual_seed(0)
    model, target = build_model(params, width), build_model(params, width)
    saves, loads = _operations(model, target, directory, with_frameworks=with_frameworks)
    times: dict[str, list[float]] = {name: [] for name in [*saves, *loads]}
    for index in range(rounds + 1):
        for group in (saves, loads):
            for name in _rotated(list(group), index):
                seconds = _timed(group[name])
                if index:  # round 0 warms imports, the page cache and the files to replace
                    times[name].append(seconds)
    return times, sum(p.numel() for p in model.parameters())


def summarize(times: dict[str, list[float]], params: int, rounds: int) -> dict[str, Any]:
    """Medians, minima and the per-round ratios to each target's reference, min-median."""
    result: dict[str, Any] = {
        "params": params,
        "rounds": rounds,
        "digest": default_digest(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "times": times,
        "medians": {name: statistics.median(values) for name, values in times.items()},
        "ratios": {},
    }
    for kind, (ours, reference, target) in TARGETS.items():
        ratios = sorted(r / o for r, o in zip(times[reference], times[ours]))
        result["ratios"][kind] = {
            "reference": reference,
            "min": ratios[0],
            "median": statistics.median(ratios),
            "target": target,
            "met": statistics.median(ratios) >= target,
        }
    return result


def format_report(result: dict[str, Any]) -> str:
    params, medians = result["params"], result["medians"]
    lines = [
        f"model: {params:,} parameters ({params * 4 / 1e6:.0f} MB fp32), {result['rounds']} rounds, "
        f"digest {result['digest']}, {result['cpu_count']} CPUs, load average {result['load_average']}",
        "",
        "| operation | median s | min s | max s | median GB/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in result["times"].items():
        lines.append(
            f"| {name} | {medians[name]:.3f} | {min(values):.3f} | {max(values):.3f} | "
            f"{params * 4 / 1e9 / medians[name]:.2f} |"
        )
    lines += ["", "| trainer vs | speed ratio, min-median | target | met? |", "|---|---:|---:|---|"]
    for kind, ratio in result["ratios"].items():
        lines.append(
            f"| {kind}: {ratio['reference']} | {ratio['min']:.2f}-{ratio['median']:.2f} | "
            f"≥ {ratio['target']:.1f} | {'yes' if ratio['met'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--width", type=int, default=4096, help="of each Linear(width, width)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frameworks", choices=("all", "trainer"), default="all")
    parser.add_argument("--json", default=None)
    parser.add_argument("--digest", choices=("sha256", "blake3"), default=None)
    args = parser.parse_args(argv)
    if args.digest is not None:
        os.environ["TRAINER_CHECKPOINT_DIGEST"] = args.digest
    directory = tempfile.mkdtemp(prefix="bench-ckpt-", dir=os.environ.get("BENCH_DIR"))
    try:
        times, params = run(
            args.params,
            args.rounds,
            directory,
            width=args.width,
            with_frameworks=args.frameworks == "all",
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result = summarize(times, params, args.rounds)
    print(format_report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
