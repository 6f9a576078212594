"""Starting processes, always through torch's own launcher (torchrun's elastic agent).

``torchrun_command`` builds the command line ``trainer launch`` runs; ``notebook_launcher`` and
``debug_launcher`` start a function in N processes with ``torch.distributed.launcher.api``;
``relaunch_with_torchrun`` re-runs the current script under torchrun when a Trainer asks for
several devices outside a launcher (like Lightning's subprocess launcher). No home-made process
manager: rendezvous, worker monitoring and failure handling are torchrun's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

from trainer.accelerator.launch_config import LaunchConfig
from trainer.errors import ConfigurationError, StrategyError

__all__ = [
    "debug_launcher",
    "launch_environment",
    "notebook_launcher",
    "relaunch_with_torchrun",
    "torchrun_command",
]


def launch_environment(config: LaunchConfig) -> dict[str, str]:
    """Environment variables that tell the launched processes what was chosen.

    ``gpu_ids`` other than "all" becomes ``CUDA_VISIBLE_DEVICES``, as Accelerate does;
    ``use_cpu`` hides every GPU instead.
    """
    env = {
        "TRAINER_STRATEGY": config.strategy,
        "ACCELERATE_MIXED_PRECISION": config.mixed_precision,
        "TRAINER_USE_CPU": "1" if config.use_cpu else "0",
    }
    if config.fsdp_config:
        env["TRAINER_FSDP_CONFIG"] = json.dumps(config.fsdp_config)
    if config.deepspeed_config:
        env["TRAINER_DEEPSPEED_CONFIG"] = json.dumps(config.deepspeed_config)
    if config.use_cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif config.gpu_ids != "all":
        env["CUDA_VISIBLE_DEVICES"] = config.gpu_ids
    return env


def torchrun_command(
    config: LaunchConfig, script: str, script_args: list[str], *, module: bool = False
) -> list[str]:
    """``python -m torch.distributed.run ...`` for ``config`` (one or several machines).

    Several machines meet at ``main_process_ip:main_process_port`` (default port 29500): given
    to torchrun as the master address when ``same_network`` (machines on one local network), else
    as the rendezvous endpoint, as Accelerate does; a ``rdzv_backend`` other than "static" always
    gets the endpoint.
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(config.num_processes),
    ]
    if config.num_machines == 1 and not config.main_process_ip:
        command.append("--standalone")
    else:
        port = config.main_process_port or 29500
        command += ["--nnodes", str(config.num_machines), "--node_rank", str(config.machine_rank)]
        if config.same_network:
            command += ["--master_addr", str(config.main_process_ip), "--master_port", str(port)]
        if config.rdzv_backend != "static" or not config.same_network:
            command += [
                "--rdzv_backend",
                config.rdzv_backend,
                "--rdzv_endpoint",
                f"{config.main_process_ip}:{port}",
            ]
    if module:
        command.append("-m")
    return [*command, script, *script_args]


def relaunch_with_torchrun(num_processes: int) -> None:
    """Run the current script again under torchrun with ``num_processes``; exit with its status."""
    script = sys.argv[0]
    if not script or script == "-c" or not os.path.isfile(script):
        raise StrategyError(
            f"devices={num_processes} outside a launcher: this process is not a script that can be re-run "
            "(interactive or `python -c`). Use trainer.notebook_launcher(fn, num_processes=...) or "
            "`trainer launch --num_processes N script.py`."
        )
    config = LaunchConfig(
        num_processes=num_processes,
        distributed_type=os.environ.get("TRAINER_DISTRIBUTED_TYPE", "MULTI_CPU"),
    )
    command = torchrun_command(config, script, sys.argv[1:])
    env = {**os.environ, "TRAINER_RELAUNCHED": "1"}
    print(
        f"trainer: starting {num_processes} processes: {' '.join(command)}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(subprocess.run(command, env=env).returncode)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _elastic_launch(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    num_processes: int,
    *,
    num_nodes: int,
    node_rank: int,
    master_addr: str,
    port: int,
    env: dict[str, str],
    start_method: str,
) -> dict[int, Any]:
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig
    from torch.distributed.launcher.api import elastic_launch

    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # inherited by the workers
    try:
        config = ElasticConfig(
            min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=num_processes,
            run_id=uuid.uuid4().hex, rdzv_backend="c10d", rdzv_endpoint=f"{master_addr}:{port}",
            rdzv_configs={"rank": node_rank, "is_host": node_rank == 0}, max_restarts=0,
            monitor_interval=0.1, start_method=start_method,
        )  # fmt: skip
        return elastic_launch(config, function)(*args)
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
) -> dict[int, Any]:
    """Run ``function(*args)`` in ``num_processes`` processes (fork, so notebook cells work).

    Returns each rank's return value by rank. Inside, a bare ``Accelerator()`` or a Trainer with
    ``strategy="auto"`` runs DDP over the processes.

    Examples:
        >>> def train():
        ...     accelerator = Accelerator()
        ...     return accelerator.process_index
        >>> notebook_launcher(train, num_processes=2)
        {0: 0, 1: 1}
    """
    import torch

    count = num_processes or max(1, torch.cuda.device_count())
    if count < 1:
        raise ConfigurationError(f"notebook_launcher(num_processes={count}): expected >= 1.")
    config = LaunchConfig(
        num_processes=count,
        distributed_type="MULTI_GPU" if torch.cuda.is_available() else "MULTI_CPU",
        mixed_precision=mixed_precision,
    )
    return _elastic_launch(
        function,
        args,
        count,
        num_nodes=num_nodes,
        node_rank=node_rank,
        master_addr=master_addr,
        port=int(use_port),
        env=launch_environment(config),
        start_method="fork",
    )


def debug_launcher(
    function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2
) -> dict[int, Any]:
    """Run ``function(*args)`` in ``num_processes`` CPU processes on a free port (for debugging).

    Examples:
        >>> debug_launcher(lambda: Accelerator().num_processes, num_processes=2)
        {0: 2, 1: 2}
    """
    config = LaunchConfig(num_processes=num_processes, distributed_type="MULTI_CPU", use_cpu=True)
    env = launch_environment(config)
    return _elastic_launch(
        function,
        args,
        num_processes,
        num_nodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        port=_free_port(),
        env=env,
        start_method="fork",
    )
