"""``trainer test``: launch a built-in distributed self-check with the current launch config.

Every process prepares data and a small model through a bare ``Accelerator()``, trains a few
steps, and checks gather / reduce / broadcast and that all replicas hold the same weights; the
main process prints ``self-check passed`` and the job's facts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from typing import Any

__all__ = ["add_parser", "check", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``test``."""
    parser = subparsers.add_parser(
        "test", help="run a distributed self-check with the launch config", description=__doc__
    )
    parser.add_argument(
        "--config_file", default=None, help="launch config YAML (default: the standard location)"
    )
    return parser


def check() -> None:
    """The self-check body, run in every launched process."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    seen = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen += len(accelerator.gather_for_metrics(x))
    rank = accelerator.process_index
    total = accelerator.reduce(torch.tensor([float(rank)]), "sum").item()
    expected_total = sum(range(accelerator.num_processes))
    weights = accelerator.unwrap_model(model).weight.detach()
    reference = accelerator.broadcast(weights.clone())
    problems = []
    if seen != 64:
        problems.append(f"gather_for_metrics saw {seen} samples, expected 64")
    if total != expected_total:
        problems.append(f"reduce gave {total}, expected {expected_total}")
    if not torch.equal(weights, reference):
        problems.append("replicas hold different weights")
    if problems:
        raise SystemExit(f"rank {rank}: self-check FAILED: " + "; ".join(problems))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(
            f"self-check passed: {accelerator.num_processes} processes, {accelerator.distributed_type}, "
            f"device {accelerator.device}, mixed_precision {accelerator.mixed_precision}"
        )


def run(args: argparse.Namespace) -> int:
    """Launch ``check`` (this module, run with ``-m``) on the configured processes."""
    from trainer.accelerator.launchers import launch_environment, torchrun_command
    from trainer.cli.launch import resolve_config

    overrides = (
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "mixed_precision",
    )
    namespace = argparse.Namespace(
        config_file=args.config_file, strategy=None, cpu=False, **dict.fromkeys(overrides)
    )
    config = resolve_config(namespace)
    command = torchrun_command(config, "trainer.cli.selfcheck", [], module=True)
    return subprocess.run(command, env={**os.environ, **launch_environment(config)}).returncode


if __name__ == "__main__":
    check()
