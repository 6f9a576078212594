"""``trainer config``: write the launch config file, interactively or with defaults.

``trainer config`` asks a few questions (number of machines and processes, strategy, mixed
precision, FSDP options); ``trainer config --default`` writes a config for this machine without
asking (all GPUs with DDP, else one CPU process). Both accept ``--config_file F``.

The number of processes is the total over all machines, as in Accelerate's file (each machine
runs num_processes / num_machines). The strategy question offers every registered strategy (an
Accelerate ``distributed_type`` such as MULTI_GPU is accepted too). The file gets the
distributed_type that starts the chosen strategy, and a ``strategy`` key only for a strategy no
distributed_type starts (``model_parallel``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``config``."""
    parser = subparsers.add_parser(
        "config",
        help="write the launch config file (interactive or --default)",
        description=__doc__,
    )
    parser.add_argument(
        "--config_file", default=None, help="where to write (default: the standard location)"
    )
    parser.add_argument(
        "--default", action="store_true", help="write defaults for this machine without asking"
    )
    return parser


def _ask(
    question: str,
    default: Any,
    cast: Callable[[str], Any] = str,
    choices: tuple[str, ...] | None = None,
) -> Any:
    hint = f" [{'/'.join(choices)}]" if choices else ""
    while True:
        answer = input(f"{question}{hint} ({default}): ").strip()
        if not answer:
            return default
        try:
            value = cast(answer)
        except ValueError:
            print(f"  please answer with a {getattr(cast, '__name__', 'value')}")
            continue
        if choices is None or value in choices:
            return value
        print(f"  please answer one of {', '.join(choices)}")


def _yes(answer: str) -> bool:
    return answer.lower() in ("y", "yes", "true", "1")


def interactive_config() -> Any:
    """Ask the questions; return a LaunchConfig."""
    from trainer.accelerator.launch_config import LaunchConfig
    from trainer.strategies import STRATEGY_REGISTRY, distributed_type_strategies

    strategy_of = distributed_type_strategies()
    machines = _ask("How many machines?", 1, int)
    rank, ip, port = 0, None, None
    if machines > 1:
        rank = _ask("The rank of this machine?", 0, int)
        ip = _ask("The IP address of the machine of rank 0?", "127.0.0.1")
        port = _ask("The port to use on it?", 29500, int)
    strategy = _ask(
        "Which strategy?",
        strategy_of["MULTI_CPU"],
        lambda answer: strategy_of.get(answer.upper(), answer.lower()),
        tuple(STRATEGY_REGISTRY),
    )
    per_machine = 1 if strategy == strategy_of["NO"] else 2
    question = (
        f"How many processes in total, over all {machines} machines?"
        if machines > 1
        else "How many processes?"
    )
    processes = _ask(question, per_machine * machines, int)
    use_cpu = _yes(_ask("Run on CPU only?", "no"))
    precision = _ask("Mixed precision?", "no", str.lower, ("no", "fp16", "bf16", "fp8"))
    fsdp = _ask_fsdp() if strategy == strategy_of["FSDP"] else {}
    kind = _distributed_type(strategy, use_cpu)
    return LaunchConfig(
        distributed_type=kind, strategy=strategy, num_machines=machines, machine_rank=rank,
        main_process_ip=ip, main_process_port=port, num_processes=processes, use_cpu=use_cpu,
        mixed_precision=precision, fsdp_config=fsdp,
    )  # fmt: skip


def _distributed_type(strategy: str, use_cpu: bool) -> str:
    """The distributed_type that starts ``strategy`` (MULTI_CPU/MULTI_GPU if several or none do)."""
    import torch

    from trainer.strategies import distributed_type_strategies

    several = "MULTI_CPU" if use_cpu or not torch.cuda.is_available() else "MULTI_GPU"
    kinds = [kind for kind, name in distributed_type_strategies().items() if name == strategy]
    return several if several in kinds or not kinds else kinds[0]


def _ask_fsdp() -> dict[str, Any]:
    """The FSDP questions; Accelerate's fsdp_config keys."""
    fsdp: dict[str, Any] = {"fsdp_version": 2}
    fsdp["fsdp_auto_wrap_policy"] = _ask(
        "Auto wrap policy?",
        "TRANSFORMER_BASED_WRAP",
        str.upper,
        ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"),
    )
    if fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = _ask(
            "Layer class names to wrap (comma separated)?", ""
        )
    fsdp["fsdp_reshard_after_forward"] = _yes(_ask("Reshard after forward?", "yes"))
    fsdp["fsdp_cpu_offload"] = _yes(_ask("Offload parameters to CPU?", "no"))
    fsdp["fsdp_state_dict_type"] = _ask(
        "State dict type?",
        "SHARDED_STATE_DICT",
        str.upper,
        ("SHARDED_STATE_DICT", "FULL_STATE_DICT"),
    )
    fsdp["fsdp_activation_checkpointing"] = _yes(_ask("Activation checkpointing?", "no"))
    fsdp["fsdp_cpu_ram_efficient_loading"] = _yes(_ask("CPU-RAM-efficient loading?", "no"))
    return fsdp


def default_config() -> Any:
    """All local GPUs with DDP, or a single CPU process."""
    import torch

    from trainer.accelerator.launch_config import LaunchConfig

    gpus = torch.cuda.device_count()
    if gpus > 1:
        return LaunchConfig(distributed_type="MULTI_GPU", num_processes=gpus)
    return LaunchConfig(distributed_type="NO", num_processes=1, use_cpu=gpus == 0)


def run(args: argparse.Namespace) -> int:
    """Write the config and say where."""
    from trainer.accelerator.launch_config import write_launch_config

    config = default_config() if args.default else interactive_config()
    path = write_launch_config(config, args.config_file)
    print(f"launch config written to {path}")
    return 0
