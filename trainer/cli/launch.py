"""``trainer launch``: run a script on N processes / M machines through torchrun.

The command line is torchrun's; the settings come from the flags, else the launch config file
(``--config_file`` or the default location), in Accelerate's ``default_config.yaml`` shape.
The launched processes learn the strategy, precision and FSDP options from the environment, so a
bare ``Accelerator()`` or ``Trainer(strategy="auto")`` picks them up.

Examples:
    $ trainer launch --num_processes 2 train.py --epochs 3
    $ trainer launch --config_file fsdp.yaml --mixed_precision bf16 train.py
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from typing import Any

__all__ = ["add_parser", "run"]

_OVERRIDES = (
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "mixed_precision",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``launch``."""
    parser = subparsers.add_parser(
        "launch",
        help="run a script on several processes/machines via torchrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config_file",
        default=None,
        help="launch config YAML (default: the file `trainer config` wrote)",
    )
    parser.add_argument("--num_processes", type=int, default=None, help="processes per machine")
    parser.add_argument("--num_machines", type=int, default=None)
    parser.add_argument("--machine_rank", type=int, default=None)
    parser.add_argument("--main_process_ip", default=None)
    parser.add_argument("--main_process_port", type=int, default=None)
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16", "fp8"], default=None)
    parser.add_argument(
        "--strategy",
        choices=["single", "ddp", "fsdp", "deepspeed"],
        default=None,
        help="overrides distributed_type",
    )
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if GPUs are present")
    parser.add_argument(
        "-m", "--module", action="store_true", help="the script is a module name (python -m)"
    )
    parser.add_argument("--dry_run", action="store_true", help="print the command and exit")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def resolve_config(args: argparse.Namespace) -> Any:
    """The launch config: file (or defaults) with the command-line flags on top."""
    from trainer.accelerator.launch_config import LaunchConfig, load_launch_config

    config = load_launch_config(args.config_file)
    changes = {name: getattr(args, name) for name in _OVERRIDES if getattr(args, name) is not None}
    if args.strategy is not None:
        changes["distributed_type"] = {
            "single": "NO",
            "ddp": "MULTI_CPU",
            "fsdp": "FSDP",
            "deepspeed": "DEEPSPEED",
        }[args.strategy]
    if args.cpu:
        changes["use_cpu"] = True
    merged = dataclasses.replace(config, **changes) if changes else config
    if merged.distributed_type == "NO" and merged.num_processes * merged.num_machines > 1:
        merged = dataclasses.replace(merged, distributed_type="MULTI_CPU")
    return LaunchConfig(**merged.to_dict())  # re-check the merged values


def run(args: argparse.Namespace) -> int:
    """Build the torchrun command and run it; return its exit status."""
    from trainer.accelerator.launchers import launch_environment, torchrun_command

    config = resolve_config(args)
    command = torchrun_command(config, args.script, list(args.script_args), module=args.module)
    env = {**os.environ, **launch_environment(config)}
    if args.dry_run:
        for key, value in sorted(launch_environment(config).items()):
            print(f"{key}={value}")
        print(" ".join(command))
        return 0
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
