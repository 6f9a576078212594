"""Checkpoint save/load speed: trainer's format against raw safetensors and torch.save/load.

One process, a ~100M-parameter fp32 model (about 400 MB). Each round times, in turn:
  save: trainer.checkpoint.write_checkpoint (safetensors + sha256 + fsync + manifest, atomic),
        safetensors.torch.save_file, safetensors save_file + fsync, torch.save
  load: trainer.checkpoint.read_checkpoint (sha256 verification included) + load_state_dict,
        safetensors load_file + load_state_dict, torch.load(weights_only=True) + load_state_dict
Files go to a temporary directory on the same disk; the page cache is warm after the first
round (state it when quoting). Ratios are raw time / trainer time (>1 means trainer is faster).

    python benchmarks/bench_checkpoint.py --rounds 5 [--params 100e6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from safetensors.torch import load_file, save_file

from trainer.checkpoint import read_checkpoint, write_checkpoint


def build_model(params: float) -> torch.nn.Module:
    width = 4096
    layers = max(1, round(params / (width * width + width)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def run(params: float, rounds: int, directory: str) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model = build_model(params)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    target = build_model(params)
    times: dict[str, list[float]] = {}
    ours_dir = os.path.join(directory, "ck")
    raw_file = os.path.join(directory, "raw.safetensors")
    pt_file = os.path.join(directory, "raw.pt")

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    for _ in range(rounds):
        record("save trainer", _timed(lambda: write_checkpoint(ours_dir, {"state_dict": state})))
        record("save safetensors", _timed(lambda: save_file(state, raw_file)))
        record(
            "save safetensors+fsync", _timed(lambda: (save_file(state, raw_file), _fsync(raw_file)))
        )
        record("save torch.save", _timed(lambda: torch.save(state, pt_file)))
        record(
            "load trainer",
            _timed(lambda: target.load_state_dict(read_checkpoint(ours_dir)["state_dict"])),
        )
        record("load safetensors", _timed(lambda: target.load_state_dict(load_file(raw_file))))
        record(
            "load torch.load",
            _timed(lambda: target.load_state_dict(torch.load(pt_file, weights_only=True))),
        )
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="bench-ckpt-", dir=os.environ.get("BENCH_DIR"))
    try:
        times = run(args.params, args.rounds, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    params = sum(p.numel() for p in build_model(args.params).parameters())
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"model: {params:,} parameters ({params * 4 / 1e6:.0f} MB fp32), {args.rounds} rounds, median seconds"
    )
    print("| operation | median s | min s | max s | raw/trainer |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        base = "save trainer" if name.startswith("save") else "load trainer"
        ratio = medians[name] / medians[base]
        print(
            f"| {name} | {medians[name]:.3f} | {min(values):.3f} | {max(values):.3f} | {ratio:.2f} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(
                {"params": params, "rounds": args.rounds, "times": times, "medians": medians},
                file,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
