"""Training throughput and peak memory on one CUDA device: the ``gpt`` template's model in bf16.

Raw PyTorch loop, trainer's ``Trainer`` and Lightning's ``Trainer`` train the same GPT
(``templates/gpt/char_gpt/model.py``; by default 6 layers, 6 heads, width 384, context 256:
10.8M parameters, nanoGPT's character-level configuration) on the same synthetic tokens, with
autocast to bfloat16 over fp32 parameters (``precision="bf16-mixed"``) and AdamW (lr 3e-4,
betas 0.9/0.95, no scheduler). Every variant reads CPU batches from the same ``DataLoader``
(batch 64, ``pin_memory=True``) and moves them to the device itself, as each framework does:

- ``raw``: ``x, y = x.to(dev, non_blocking=True), ...; with torch.autocast("cuda", bfloat16):
  loss = ...; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)``
- ``trainer``: ``trainer.Trainer(accelerator="cuda", devices=1, precision="bf16-mixed")``,
  logger, bar, summary, checkpointing and sanity steps off.
- ``lightning``: ``lightning.pytorch.Trainer`` with the same settings (when installed).

Each run takes ``--warmup`` untimed steps, then ``--steps`` timed steps between two
``torch.cuda.synchronize()`` calls (a callback at the step counts for the Trainers). Tokens/s =
steps x batch x context / seconds. Peak memory is ``torch.cuda.max_memory_allocated()`` over the
run, reset before it. Rounds are interleaved, the order rotated each round; ratios are against
the same round's raw run, min-median.

Without CUDA it prints that it skipped and exits 0 (``--device cpu`` runs the same code on the
CPU, which is what the smoke test does; its figures mean nothing for a GPU).

    python -m benchmarks.bench_gpu --steps 200 --rounds 5 --json gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "gpt"
VARIANTS = ("raw", "trainer", "lightning")
CONFIGS = {
    "default": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "batch": 64},
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "batch": 4},
}
LR, BETAS = 3e-4, (0.9, 0.95)


def gpt_class() -> type[torch.nn.Module]:
    """The template's ``GPT`` (its folder goes on ``sys.path``; nothing else of it is imported)."""
    if str(TEMPLATE) not in sys.path:
        sys.path.insert(0, str(TEMPLATE))
    from char_gpt.model import GPT

    return GPT


def build_model(config: dict[str, int]) -> torch.nn.Module:
    torch.manual_seed(0)
    return gpt_class()(
        vocab_size=256,
        block_size=config["block_size"],
        n_layer=config["n_layer"],
        n_head=config["n_head"],
        n_embd=config["n_embd"],
        dropout=0.0,
    )


def build_loader(config: dict[str, int], steps: int, device: str) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(
        0, 256, (steps * config["batch"], config["block_size"] + 1), generator=generator
    )
    dataset = TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    return DataLoader(
        dataset, batch_size=config["batch"], shuffle=False, pin_memory=device == "cuda"
    )


def build_optimizer(model: torch.nn.Module, device: str) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, fused=device == "cuda")


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _StepClock:
    """Reads the clock after ``warmup`` steps and after the last, synchronizing the device."""

    def __init__(self, warmup: int, total: int, device: str) -> None:
        self.warmup, self.total, self.device = warmup, total, device
        self.start = self.end = 0.0

    def after_step(self, done: int) -> None:
        if done == self.warmup:
            _sync(self.device)
            self.start = time.perf_counter()
        elif done == self.total:
            _sync(self.device)
            self.end = time.perf_counter()


def run_raw(config: dict[str, int], warmup: int, steps: int, device: str) -> float:
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, device)
    clock = _StepClock(warmup, warmup + steps, device)
    for done, (x, y) in enumerate(build_loader(config, warmup + steps, device), start=1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_of(model, x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.after_step(done)
    return clock.end - clock.start


def _trainer_options(steps: int) -> dict[str, Any]:
    return {
        "max_epochs": 1,
        "max_steps": steps,
        "devices": 1,
        "precision": "bf16-mixed",
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
    }


def run_trainer(config: dict[str, int], warmup: int, steps: int, device: str) -> float:
    import trainer

    clock = _StepClock(warmup, warmup + steps, device)

    class Module(trainer.TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model(config)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return loss_of(self.model, *batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return build_optimizer(self.model, device)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            clock.after_step(batch_idx + 1)

    fit = trainer.Trainer(accelerator=device, **_trainer_options(warmup + steps))
    fit.fit(Module(), build_loader(config, warmup + steps, device))
    return clock.end - clock.start


def run_lightning(config: dict[str, int], warmup: int, steps: int, device: str) -> float:
    import lightning.pytorch as pl

    # Lightning sets its loggers' level when imported: quiet them after.
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning(\.|$)")

    clock = _StepClock(warmup, warmup + steps, device)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model(config)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return loss_of(self.model, *batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return build_optimizer(self.model, device)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            clock.after_step(batch_idx + 1)

    accelerator = "gpu" if device == "cuda" else "cpu"
    fit = pl.Trainer(
        accelerator=accelerator, default_root_dir=None, **_trainer_options(warmup + steps)
    )
    fit.fit(Module(), build_loader(config, warmup + steps, device))
    return clock.end - clock.start


RUNNERS: dict[str, Callable[[dict[str, int], int, int, str], float]] = {
    "raw": run_raw,
    "trainer": run_trainer,
    "lightning": run_lightning,
}


def _measure(
    name: str, config: dict[str, int], warmup: int, steps: int, device: str
) -> dict[str, Any]:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    seconds = RUNNERS[name](config, warmup, steps, device)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {
        "seconds": seconds,
        "tokens_per_s": steps * config["batch"] * config["block_size"] / seconds,
        "peak_bytes": peak,
    }


def run_benchmark(
    *, config_name: str, warmup: int, steps: int, rounds: int, device: str
) -> dict[str, Any]:
    """Every variant ``rounds`` times, interleaved (one untimed round first); JSON-able figures."""
    import importlib.util

    config = CONFIGS[config_name]
    names = tuple(n for n in VARIANTS if n != "lightning" or importlib.util.find_spec("lightning"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index in range(rounds + 1):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            figures = _measure(name, config, warmup, steps, device)
            if index:  # round 0: compilation of kernels, cuDNN/cuBLAS heuristics, imports
                runs[name].append(figures)
    return _summarize(runs, config, config_name, warmup, steps, rounds, device)


def _summarize(
    runs: dict[str, list[dict[str, Any]]],
    config: dict[str, int],
    config_name: str,
    warmup: int,
    steps: int,
    rounds: int,
    device: str,
) -> dict[str, Any]:
    params = sum(p.numel() for p in build_model(config).parameters())
    variants: dict[str, Any] = {}
    for name, figures in runs.items():
        ratios = sorted(f["tokens_per_s"] / r["tokens_per_s"] for f, r in zip(figures, runs["raw"]))
        peaks = [f["peak_bytes"] for f in figures if f["peak_bytes"] is not None]
        variants[name] = {
            "tokens_per_s_median": statistics.median(f["tokens_per_s"] for f in figures),
            "ratio_min": ratios[0],
            "ratio_median": statistics.median(ratios),
            "peak_mb_max": max(peaks) / 2**20 if peaks else None,
            "runs": figures,
        }
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {
        "config": {
            **config,
            "name": config_name,
            "parameters": params,
            "warmup": warmup,
            "steps": steps,
            "rounds": rounds,
            "device": name,
            "torch": torch.__version__,
        },
        "variants": variants,
    }


def format_table(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"GPT {c['parameters']:,} parameters ({c['n_layer']} layers, width {c['n_embd']}, context "
        f"{c['block_size']}), batch {c['batch']}, bf16-mixed, {c['steps']} steps after {c['warmup']} "
        f"warm-up, {c['rounds']} rounds, {c['device']}, torch {c['torch']}",
        "",
        "| variant | tokens/s (median) | ratio vs raw, min-median | peak memory MiB |",
        "|---|---:|---:|---:|",
    ]
    for name, v in result["variants"].items():
        peak = f"{v['peak_mb_max']:,.0f}" if v["peak_mb_max"] is not None else "—"
        lines.append(
            f"| {name} | {v['tokens_per_s_median']:,.0f} | {v['ratio_min']:.3f}-{v['ratio_median']:.3f} | {peak} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before them")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--config", choices=tuple(CONFIGS), default="default")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: skipped, CUDA is not available (use --device cpu to try the code path).")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as file:
                json.dump({"skipped": "CUDA is not available"}, file)
        return 0
    result = run_benchmark(
        config_name=args.config,
        warmup=args.warmup,
        steps=args.steps,
        rounds=args.rounds,
        device=args.device,
    )
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
