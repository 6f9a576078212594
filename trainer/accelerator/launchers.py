"""Starting processes, always through torch's own launcher (torchrun's elastic agent).

``torchrun_command`` builds the command line ``trainer launch`` runs, and `run_torchrun` runs that
command's agent in this process, so that the signal a scheduler sends the launcher reaches the
training processes: SIGTERM and SIGUSR1 are passed on to them (they save a checkpoint and exit 0,
`trainer.trainer.preemption`), and the launcher exits with their status — 0 whichever process got
the signal. On several machines the launchers also watch each other through the rendezvous
store (`trainer.accelerator.machine_watch`). ``notebook_launcher`` and ``debug_launcher`` start a
function in N processes with ``torch.distributed.launcher.api``; ``relaunch_with_torchrun``
re-runs the current script under torchrun when a Trainer asks for several devices outside a
launcher (like Lightning's subprocess launcher). No home-made process manager: rendezvous,
worker monitoring, restarts and failure handling are torchrun's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from trainer.accelerator.launch_config import LaunchConfig
from trainer.accelerator.machine_watch import MachineWatch, child_processes, training_processes
from trainer.errors import ConfigurationError, StrategyError

__all__ = [
    "debug_launcher",
    "launch_environment",
    "notebook_launcher",
    "patch_environment",
    "relaunch_with_torchrun",
    "run_torchrun",
    "torchrun_command",
]

# Signals the launcher passes on to the training processes instead of stopping them (torchrun's
# agent would stop them and exit 1); torchrun keeps handling the others.
_FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name)
)
_TORCHRUN_HANDLES = ",".join(
    name for name in ("SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


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
    config: LaunchConfig,
    script: str,
    script_args: list[str],
    *,
    module: bool = False,
    max_restarts: int = 0,
) -> list[str]:
    """``python -m torch.distributed.run ...`` for ``config`` (one or several machines).

    Each machine starts ``config.processes_per_machine`` processes (``num_processes`` is the
    total, as in Accelerate). Several machines meet at ``main_process_ip:main_process_port``
    (default port 29500): torchrun's master address for the static rendezvous on one network
    (``same_network``), else the rendezvous endpoint of ``rdzv_backend``, as Accelerate does.
    ``max_restarts`` > 0 lets torchrun restart the processes of every machine that many times
    after a failure.

    Examples:
        >>> config = LaunchConfig(num_machines=2, num_processes=16, main_process_ip="10.0.0.1")
        >>> " ".join(torchrun_command(config, "train.py", [])[3:])
        '--nproc_per_node 8 --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 train.py'
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(config.processes_per_machine),
    ]
    if config.num_machines == 1 and not config.main_process_ip:
        command.append("--standalone")
    else:
        port = config.main_process_port or 29500
        command += ["--nnodes", str(config.num_machines)]
        if config.rdzv_backend == "static" and config.same_network:
            command += ["--node_rank", str(config.machine_rank)]
            command += ["--master_addr", str(config.main_process_ip), "--master_port", str(port)]
        else:
            if config.rdzv_backend == "static":  # other backends number the machines themselves
                command += ["--node_rank", str(config.machine_rank)]
            command += [
                "--rdzv_backend",
                config.rdzv_backend,
                "--rdzv_endpoint",
                f"{config.main_process_ip}:{port}",
            ]
    if max_restarts:
        command += ["--max_restarts", str(max_restarts)]
    if module:
        command.append("-m")
    return [*command, script, *script_args]


def run_torchrun(
    command: list[str], env: dict[str, str], *, watch: MachineWatch | None = None
) -> int:
    """Run a `torchrun_command` with torchrun's agent in this process; return the exit status.

    SIGTERM and SIGUSR1 sent to this process are passed on to the training processes, which
    save a preemption checkpoint and exit with 0, so the launcher exits 0 too: the status is the
    same whether the scheduler signalled the launcher, the training processes, or all of them.
    SIGINT, SIGHUP and SIGQUIT stop the processes as torchrun does. ``env`` is added to this
    process's environment (the training processes inherit it). With ``watch`` (several
    machines) a lost machine or a machine started with other settings ends this one, named.

    Returns:
        0 when every process ended with 0; 1 when one failed (torchrun's report of the failing
        rank is printed); 128 + N when stopped by signal N.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(command[3:])
    if hasattr(args, "signals_to_handle"):  # older torchrun stops the workers on SIGTERM
        args.signals_to_handle = _TORCHRUN_HANDLES
    os.environ.update(env)
    previous = _pass_on_preemption_signals()
    if watch is not None:
        watch.start()
    try:
        try:
            torchrun.run(args)
        finally:  # the processes have ended: a signal now must neither turn a failure into
            for sig in previous:  # status 0 nor kill the launcher before it reports
                signal.signal(sig, signal.SIG_IGN)
    except ChildFailedError as err:
        explanation = watch.explain_failure(err) if watch is not None else ""
        print(f"{err}{explanation}", file=sys.stderr, flush=True)
        return 1
    except SignalException as err:
        print(f"trainer launch: stopped by {err.sigval.name}.", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.stop()
    return 0


def _pass_on_preemption_signals() -> dict[int, Any]:
    """Install the handler that passes SIGTERM/SIGUSR1 on; return the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def pass_on(signum: int, frame: object) -> None:
        if not os.path.isdir("/proc"):  # the processes cannot be found: stop them as torchrun does
            from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

            _terminate_process_handler(signum, frame)
        workers = training_processes()
        for pid in workers:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # it ended meanwhile
                continue
        name = signal.Signals(signum).name
        print(
            f"trainer launch: received {name}; passed it on to {len(workers)} training "
            "process(es), which save a checkpoint and exit with status 0.",
            file=sys.stderr,
            flush=True,
        )
        # None alive and none ended unreported (between rendezvous and start): nothing to
        # save, stop. Ended ones (zombies) are left to the agent, which reports their status.
        if not workers and not any(state == "Z" for _, state in child_processes()):
            raise SystemExit(0)

    return {sig: signal.signal(sig, pass_on) for sig in _FORWARDED}


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
    print(
        f"trainer: starting {num_processes} processes: {' '.join(command)}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(run_torchrun(command, {"TRAINER_RELAUNCHED": "1"}))


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

    with patch_environment(**env):  # inherited by the workers
        config = ElasticConfig(
            min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=num_processes,
            run_id=uuid.uuid4().hex, rdzv_backend="c10d", rdzv_endpoint=f"{master_addr}:{port}",
            rdzv_configs={"rank": node_rank, "is_host": node_rank == 0}, max_restarts=0,
            monitor_interval=0.1, start_method=start_method,
        )  # fmt: skip
        returned = elastic_launch(config, function)(*args)
        return dict(sorted(returned.items()))  # by rank (torch fills it as processes end)


@contextlib.contextmanager
def patch_environment(**variables: Any) -> Iterator[None]:
    """Set environment variables inside the block and put back what was there after
    (Accelerate's ``accelerate.utils.patch_environment``): names are upper-cased, values made
    strings; a variable that was not set is removed again."""
    variables = {key.upper(): str(value) for key, value in variables.items()}
    previous = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        yield
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
