"""Start a real multi-process job as users do — torchrun, gloo on CPU — for the distributed tests.

One place for what every such test needs: the repository on ``PYTHONPATH``, one OpenMP thread
per process (2 cores), and on a timeout the whole job killed, workers included (a hung worker
left behind would keep its ports and CPU for the rest of the test run). torchrun starts each
worker in a session of its own, so killing the job's session is not enough: every process
descended from the job is found first and killed too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a job: this one, the repository importable, one thread per process."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **extra)


def run_job(
    command: Sequence[str],
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
) -> subprocess.CompletedProcess:
    """Run ``command`` in a session of its own; on a timeout kill the session, then re-raise."""
    with subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(env) if env is not None else job_env(), cwd=cwd, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_job(process.pid)
            process.communicate()
            raise
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)


def descendants(pid: int) -> list[int]:
    """Every living process descended from ``pid`` (read from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_job(pid: int) -> None:
    """SIGKILL the job ``pid`` leads: its session, and every descendant wherever its session is."""
    family = descendants(pid)
    for target in [pid, *family]:
        try:
            os.killpg(target, signal.SIGKILL)  # the session/group it leads, if it leads one
        except OSError:
            pass
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass


def torchrun(
    script: str | Path,
    *args: str,
    nprocs: int = 2,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node nprocs script args...`` from the repository root."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(nprocs), str(script), *args]
    return run_job(command, timeout=timeout, env=env)


def output_tail(result: subprocess.CompletedProcess, size: int = 3000) -> str:
    """The end of a job's stdout and stderr, for an assertion message."""
    return result.stdout[-size:] + result.stderr[-size:]


def flip_byte(path: str | os.PathLike[str], offset: int) -> None:
    """Invert the byte of ``path`` at ``offset`` (from the end when negative): a damaged file."""
    with open(path, "r+b") as file:
        file.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
