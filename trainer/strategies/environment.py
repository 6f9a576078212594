"""Which process this is, read from the launcher's environment (torchrun, SLURM) — never guessed.

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``; SLURM sets ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the node list
(one task per process, ``srun``). The torchrun variables win when both are present.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["ClusterEnvironment", "detect_environment"]


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
        return self.world_size > 1


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
        and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")
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
