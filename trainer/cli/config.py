"""``trainer config``: write the launch config file, interactively or with defaults.

``trainer config`` asks a few questions (number of machines and processes, distributed type,
mixed precision, FSDP options); ``trainer config --default`` writes a config for this machine
without asking (all GPUs with DDP, else one CPU process). Both accept ``--config_file F``.
"""

from __future__ import annotations

import argparse
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
    question: str, default: Any, cast: type = str, choices: tuple[str, ...] | None = None
) -> Any:
    hint = f" [{'/'.join(choices)}]" if choices else ""
    while True:
        answer = input(f"{question}{hint} ({default}): ").strip()
        if not answer:
            return default
        try:
            value = cast(answer)
        except ValueError:
            print(f"  please answer with a {cast.__name__}")
            continue
        if choices is None or value in choices:
            return value
        print(f"  please answer one of {', '.join(choices)}")


def _yes(answer: str) -> bool:
    return answer.lower() in ("y", "yes", "true", "1")


def interactive_config() -> Any:
    """Ask the questions; return a LaunchConfig."""
    from trainer.accelerator.launch_config import LaunchConfig

    machines = _ask("How many machines?", 1, int)
    rank, ip, port = 0, None, None
    if machines > 1:
        rank = _ask("The rank of this machine?", 0, int)
        ip = _ask("The IP address of the machine of rank 0?", "127.0.0.1")
        port = _ask("The port to use on it?", 29500, int)
    kind = _ask(
        "Which kind of distribution?",
        "MULTI_CPU",
        str.upper,
        ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"),
    )
    processes = _ask("How many processes per machine?", 1 if kind == "NO" else 2, int)
    use_cpu = _yes(_ask("Run on CPU only?", "no"))
    precision = _ask("Mixed precision?", "no", str.lower, ("no", "fp16", "bf16", "fp8"))
    fsdp: dict[str, Any] = {}
    if kind == "FSDP":
        fsdp["fsdp_version"] = 2
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
    return LaunchConfig(
        distributed_type=kind, num_machines=machines, machine_rank=rank, main_process_ip=ip,
        main_process_port=port, num_processes=processes, use_cpu=use_cpu, mixed_precision=precision,
        fsdp_config=fsdp,
    )  # fmt: skip


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
