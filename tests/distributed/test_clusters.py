"""Several machines, simulated: two `trainer launch` agents on this host, each its own machine
(issue #18, item 2).

- 2 machines x 2 processes, with the static and the c10d rendezvous, end with final weights
  equal to 1 machine x 4 processes, for DDP and for FSDP (one job trains both). The static run
  is docs/clusters.md's Kubernetes recipe: its ``args`` in two simulated pods, with the
  variables the training operator sets expanded as Kubernetes expands ``$(NAME)``.
- A whole machine lost (its launcher and processes SIGKILLed) ends the other within 60 s, with a
  message naming the lost machine: machine 1 (missed by its heartbeats) or machine 0 (which
  also holds the rendezvous store).
- Two machines started with different settings both fail within seconds, naming the settings.

What the simulation cannot show: a real network. A killed process here closes its sockets at
once; a machine that loses power does not, and the survivors learn it from the launchers'
heartbeats (10 s), which this also exercises.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from trainer.accelerator.machine_watch import training_processes

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "distributed" / "cluster_job.py"

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(
    root: Path, mode: str, *flags: str, log: str, tag: str = "", env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`trainer launch --cpu ... cluster_job.py ROOT MODE`, output to ROOT/<log>."""
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.update(CLUSTER_TAG=tag or mode, XDG_CACHE_HOME=str(root / "cache"))  # no user config
    command = [sys.executable, "-m", "trainer.cli", "launch", "--cpu", *flags, str(JOB)]
    with open(root / log, "w") as out:
        return subprocess.Popen(
            [*command, str(root), mode], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )


def machines(
    root: Path, mode: str, *flags: str, per_machine: tuple[str, ...] = ((), ()), tag: str = ""
):
    """Two launchers on this host, machine_rank 0 and 1; returns them."""
    common = ["--num_machines", "2", "--main_process_ip", "127.0.0.1"]
    common += ["--main_process_port", str(_free_port()), *flags]
    return [
        launch(
            root,
            mode,
            *common,
            "--machine_rank",
            str(rank),
            *per_machine[rank],
            log=f"machine{rank}.log",
            tag=tag,
        )
        for rank in (0, 1)
    ]


def pods(root: Path, mode: str, tag: str) -> list[subprocess.Popen]:
    """The Kubernetes recipe's master and worker pods as two launchers on this host."""
    page = (ROOT / "docs" / "clusters.md").read_text()
    found = re.search(r"<!-- recipe: kubernetes -->\n```yaml\n(.*?)\n```", page, flags=re.DOTALL)
    assert found, "docs/clusters.md lost its Kubernetes recipe"
    spec = yaml.safe_load(found.group(1))["spec"]["pytorchReplicaSpecs"]["Master"]
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"] == ["trainer", "launch"] and container["args"][-1] == "train.py"
    port = _free_port()
    launched = []
    for rank in (0, 1):  # what the training operator sets in each pod
        pod = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
        }
        args = [expand(arg, pod) for arg in container["args"][:-1]]
        launched.append(launch(root, mode, *args, log=f"machine{rank}.log", tag=tag, env=pod))
    return launched


def expand(arg: str, env: dict[str, str]) -> str:
    """``$(NAME)`` replaced by ``env[NAME]``, as Kubernetes expands a container's ``args``."""
    return re.sub(r"\$\((\w+)\)", lambda match: env[match.group(1)], arg)


def finish(processes: list[subprocess.Popen], timeout: float = 240) -> list[int]:
    try:
        return [process.wait(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def output(root: Path, log: str) -> str:
    return (root / log).read_text(errors="replace")


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory) -> Path:
    """1 machine x 4 processes: DDP's and FSDP's final weights."""
    root = tmp_path_factory.mktemp("one")
    status = finish([launch(root, "parity", "--num_processes", "4", log="one.log", tag="one")])
    assert status == [0], output(root, "one.log")[-3000:]
    return root


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_machines_of_two_end_like_one_machine_of_four(tmp_path, one_machine, backend):
    if backend == "static":
        launchers = pods(tmp_path, "parity", tag="two")
    else:
        flags = ("--num_processes", "4", "--rdzv_backend", backend)
        launchers = machines(tmp_path, "parity", *flags, tag="two")
    assert finish(launchers) == [0, 0], (
        output(tmp_path, "machine0.log")[-3000:] + output(tmp_path, "machine1.log")[-3000:]
    )
    for engine in ("ddp", "fsdp"):
        expected = weights(one_machine / f"one-{engine}" / f"final-one-{engine}.safetensors")
        final = weights(tmp_path / f"two-{engine}" / f"final-two-{engine}.safetensors")
        assert sorted(final) == sorted(expected)
        for name, tensor in expected.items():
            assert torch.equal(final[name], tensor), f"{engine} {name} ({backend})"


@pytest.mark.parametrize("lost_rank", [1, 0], ids=["worker-machine", "store-machine"])
def test_a_lost_machine_ends_the_other_within_60_s_naming_it(tmp_path, lost_rank):
    launchers = machines(tmp_path, "slow", "--num_processes", "4")
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "checkpoints").is_dir():  # both machines train
            assert time.monotonic() < deadline and all(p.poll() is None for p in launchers), output(
                tmp_path, "machine0.log"
            )[-3000:]
            time.sleep(0.2)
        lost, survivor = launchers[lost_rank], launchers[1 - lost_rank]
        for pid in [lost.pid, *training_processes(lost.pid)]:  # the whole machine
            os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        status = survivor.wait(timeout=120)
        elapsed = time.monotonic() - start
    finally:
        finish(launchers, timeout=5)
    text = output(tmp_path, f"machine{1 - lost_rank}.log")
    assert status != 0 and elapsed < 60, f"{elapsed:.0f} s, status {status}"
    # machine 1 is missed by its heartbeats; machine 0 also holds the rendezvous store
    named = (
        "machine_rank 1 (host " if lost_rank else "machine_rank 0 was lost: the rendezvous store"
    )
    assert named in text and "was lost" in text, text[-3000:]


def test_machines_started_with_different_settings_fail_fast_naming_them(tmp_path):
    start = time.monotonic()
    launchers = machines(
        tmp_path, "slow", per_machine=(("--num_processes", "4"), ("--num_processes", "2"))
    )
    assert finish(launchers, timeout=120) == [1, 1]
    assert time.monotonic() - start < 60
    for rank, other in ((0, 1), (1, 0)):
        text = output(tmp_path, f"machine{rank}.log")
        assert "the machines were started with different settings" in text, text[-3000:]
        assert f"on machine_rank {other}" in text and "num_processes=" in text
