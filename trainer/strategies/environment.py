"""Which process this is, read from the launcher's environment (torchrun, SLURM) — never guessed.

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``; SLURM sets ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the node list
(one task per process, ``srun``). The torchrun variables win when both are present.

`SLURMEnvironment` is also Lightning's plugin for what preemption does under SLURM:
``Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])`` turns the requeue after the
preemption checkpoint off (`trainer.trainer.preemption` acts on it; this module runs nothing).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, fields

__all__ = ["ClusterEnvironment", "SLURMEnvironment", "detect_environment", "slurm_job_id"]

_INTERACTIVE_JOB_NAMES = ("bash", "interactive")  # `salloc`/`srun --pty bash`: no requeue


@dataclass(frozen=True)
class ClusterEnvironment:
    """The launcher's facts about this process."""

    world_size: int = 1
    global_rank: int = 0
    local_rank: int = 0
    node_rank: int = 0
    main_address: str = "127.0.0.1"
    main_port: int = 29500
    source: str = "none"  # "torchrun", "slurm" or "none"

    @property
    def is_distributed(self) -> bool:
        """Whether the launcher started more than one process."""
        return self.world_size > 1


@dataclass(frozen=True, init=False)
class SLURMEnvironment(ClusterEnvironment):
    """This process under SLURM, and whether preemption requeues the job (Lightning's plugin).

    The process facts are read from the environment as `detect_environment` reads them. Under a
    SLURM batch job, when ``requeue_signal`` (SIGUSR1: ``#SBATCH --signal=USR1@90``) stops a fit,
    rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` once the preemption checkpoint is written, so
    the job runs again and ``fit(ckpt_path="last")`` resumes. SIGTERM (``scancel``, the time
    limit) saves but does not requeue. Without this plugin the requeue is on under SLURM.

    Args:
        auto_requeue: False: save and exit, never requeue (resubmit yourself).
        requeue_signal: the signal that requeues.

    Examples:
        >>> Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])
    """

    auto_requeue: bool = True
    requeue_signal: int = int(getattr(signal, "SIGUSR1", 10))

    def __init__(
        self,
        auto_requeue: bool = True,
        requeue_signal: int = int(getattr(signal, "SIGUSR1", 10)),
        *,
        environ: dict[str, str] | None = None,
    ) -> None:
        facts = detect_environment(environ)
        for item in fields(ClusterEnvironment):
            object.__setattr__(self, item.name, getattr(facts, item.name))
        object.__setattr__(self, "auto_requeue", bool(auto_requeue))
        object.__setattr__(self, "requeue_signal", int(requeue_signal))


def slurm_job_id(environ: dict[str, str] | None = None) -> str | None:
    """The id ``scontrol requeue`` takes for this SLURM batch job; None outside one.

    An array task is ``ARRAYJOB_TASK``; an interactive allocation (job name ``bash`` or
    ``interactive``) is None, as in Lightning, since it cannot be requeued.
    """
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_NAME") in _INTERACTIVE_JOB_NAMES:
        return None
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return job if job and re.fullmatch(r"[0-9]+(_[0-9]+)?", job) else None


def _first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list like ``node[003-005,010],gpu7``."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist)
    if match is None:
        return "127.0.0.1"
    prefix, ranges = match.group(1), match.group(3)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}"


def detect_environment(environ: dict[str, str] | None = None) -> ClusterEnvironment:
    """Read the launcher's variables from ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        local_rank = int(env.get("LOCAL_RANK", 0))
        local_world = int(env.get("LOCAL_WORLD_SIZE", 1)) or 1
        return ClusterEnvironment(
            world_size=int(env["WORLD_SIZE"]),
            global_rank=int(env["RANK"]),
            local_rank=local_rank,
            node_rank=int(env.get("GROUP_RANK", int(env["RANK"]) // local_world)),
            main_address=env.get("MASTER_ADDR", "127.0.0.1"),
            main_port=int(env.get("MASTER_PORT", 29500)),
            source="torchrun",
        )
    if (
        "SLURM_NTASKS" in env
        and "SLURM_PROCID" in env
        and env.get("SLURM_JOB_NAME") not in _INTERACTIVE_JOB_NAMES
    ):
        job_id = env.get("SLURM_JOB_ID", "0")
        return ClusterEnvironment(
            world_size=int(env["SLURM_NTASKS"]),
            global_rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            node_rank=int(env.get("SLURM_NODEID", 0)),
            main_address=env.get(
                "MASTER_ADDR", _first_slurm_host(env.get("SLURM_NODELIST", "127.0.0.1"))
            ),
            main_port=int(env.get("MASTER_PORT", 15000 + int(job_id[-4:] or 0) % 1000)),
            source="slurm",
        )
    return ClusterEnvironment()
