"""``trainer launch``: run a script on N processes / M machines through torchrun.

The command line is torchrun's; the settings come from the flags, else the launch config file
(``--config_file`` or the default location), in Accelerate's ``default_config.yaml`` shape, with
Accelerate's meanings: ``--num_processes`` is the total over all machines (each of the
``--num_machines`` machines runs num_processes / num_machines). The launched processes learn the
strategy, precision and FSDP options from the environment, so a bare ``Accelerator()`` or
``Trainer(strategy="auto")`` picks them up. ``--strategy`` takes any registered strategy name.

torchrun's agent runs inside this command: SIGTERM or SIGUSR1 sent to it reach the training
processes, which save a checkpoint and exit 0, and so does the launch. ``--max_restarts N``
restarts the processes of every machine after a failure, up to N times; a script that calls
``fit(..., ckpt_path="last")`` then resumes from the newest checkpoint. On several machines the
launchers compare their settings and watch each other: a difference, or a machine lost, ends the
job with a message naming the machine.

Examples:
    $ trainer launch --num_processes 2 train.py --epochs 3
    $ trainer launch --config_file fsdp.yaml --mixed_precision bf16 train.py
    $ trainer launch --num_machines 2 --num_processes 16 --machine_rank 0 --main_process_ip 10.0.0.1 train.py
    $ trainer launch --num_processes 8 --max_restarts 3 train.py
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run"]

_OVERRIDES = (
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "rdzv_backend",
    "mixed_precision",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``launch``."""
    from trainer.strategies import STRATEGY_REGISTRY

    parser = subparsers.add_parser(
        "launch",
        help="run a script on several processes/machines via torchrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config_file",
        default=None,
        help=(
            "launch config YAML in Accelerate's shape (default: the file `trainer config` wrote). "
            "A key set to something trainer launch would not act on is an error naming the fix: "
            "dynamo_config (compile with Trainer(compile=...)), megatron_lm_config (pass "
            "MegatronStrategy(...)), the TPU, SageMaker, debug and CPU-affinity keys, and "
            "fsdp_config/deepspeed_config for another strategy. gpu_ids sets "
            "CUDA_VISIBLE_DEVICES; same_network: false meets at the rendezvous endpoint"
        ),
    )
    parser.add_argument(
        "--num_processes",
        type=int,
        default=None,
        help=(
            "processes in total over all machines, as in Accelerate (each machine runs "
            "num_processes / num_machines)"
        ),
    )
    parser.add_argument("--num_machines", type=int, default=None, help="machines in the job")
    parser.add_argument(
        "--machine_rank", type=int, default=None, help="this machine's rank, 0 to num_machines-1"
    )
    parser.add_argument(
        "--main_process_ip", default=None, help="the address of machine_rank 0 (several machines)"
    )
    parser.add_argument("--main_process_port", type=int, default=None, help="its port (29500)")
    parser.add_argument(
        "--rdzv_backend",
        default=None,
        help="torchrun's rendezvous on several machines: static (default) or c10d",
    )
    parser.add_argument(
        "--max_restarts",
        type=int,
        default=0,
        help=(
            "restart the processes of every machine after a failure, up to this many times "
            "(torchrun's elastic agent); fit(ckpt_path='last') resumes from the newest checkpoint"
        ),
    )
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16", "fp8"], default=None)
    parser.add_argument(
        "--strategy",
        choices=list(STRATEGY_REGISTRY),
        default=None,
        help="overrides the strategy the config's distributed_type starts",
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
    """The launch config: file (or defaults) with the command-line flags on top.

    ``--strategy`` also sets the distributed_type that starts it, when one does; a config with
    several processes and distributed_type NO runs DDP (MULTI_CPU).
    """
    from trainer.accelerator.launch_config import (
        LaunchConfig,
        default_config_path,
        load_launch_config,
    )
    from trainer.strategies import distributed_type_strategies

    strategy_of = distributed_type_strategies()
    values = load_launch_config(args.config_file).to_dict()  # no strategy key unless explicit
    values.update(
        {name: getattr(args, name) for name in _OVERRIDES if getattr(args, name, None) is not None}
    )
    if args.strategy is not None:
        values["strategy"] = args.strategy
        starting = [kind for kind, name in strategy_of.items() if name == args.strategy]
        if starting and values["distributed_type"] not in starting:
            values["distributed_type"] = starting[0]
    if values.get("strategy") == strategy_of.get(values["distributed_type"]):
        del values["strategy"]  # implied, so it follows the distributed_type below
    if args.cpu:
        values["use_cpu"] = True
    if values["distributed_type"] == "NO" and values["num_processes"] > 1:
        values["distributed_type"] = "MULTI_CPU"
    file = args.config_file or (default_config_path() if default_config_path().is_file() else None)
    source = f"launch config file {file}" if file else "launch config"
    return LaunchConfig(**values, where=f"{source} with the command-line flags")


def run(args: argparse.Namespace) -> int:
    """Build the torchrun command and run its agent here; return the launch's exit status."""
    from trainer.accelerator.launchers import launch_environment, run_torchrun, torchrun_command
    from trainer.accelerator.machine_watch import MachineWatch
    from trainer.errors import ConfigurationError

    if args.max_restarts < 0:
        raise ConfigurationError(
            f"trainer launch --max_restarts {args.max_restarts}: expected 0 or more restarts."
        )
    config = resolve_config(args)
    command = torchrun_command(
        config,
        args.script,
        list(args.script_args),
        module=args.module,
        max_restarts=args.max_restarts,
    )
    env = launch_environment(config)
    if args.dry_run:
        for key, value in sorted(env.items()):
            print(f"{key}={value}")
        print(" ".join(command))
        return 0
    watch = MachineWatch.for_config(config, max_restarts=args.max_restarts)
    return run_torchrun(command, env, watch=watch)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
