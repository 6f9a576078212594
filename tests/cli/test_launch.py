"""`trainer launch`, `trainer config`, `trainer test`, the launch config file, and the launchers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import trainer
from trainer.accelerator.launch_config import LaunchConfig, default_config_path, load_launch_config

ROOT = Path(__file__).resolve().parents[2]


def cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "trainer.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env=environment,
        timeout=timeout,
        cwd=ROOT,
    )


def test_dry_run_single_machine(tmp_path):
    out = cli(
        "launch",
        "--num_processes",
        "2",
        "--cpu",
        "--mixed_precision",
        "bf16",
        "--dry_run",
        "train.py",
        "--lr",
        "0.1",
        env={"XDG_CACHE_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert "TRAINER_STRATEGY=ddp" in lines and "ACCELERATE_MIXED_PRECISION=bf16" in lines
    assert lines[-1].endswith(
        "-m torch.distributed.run --nproc_per_node 2 --standalone train.py --lr 0.1"
    )


def test_dry_run_several_machines_from_a_config_file(tmp_path):
    config = tmp_path / "multi.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "MULTI_GPU",
                "num_machines": 2,
                "num_processes": 8,  # the total over both machines, as in Accelerate
                "machine_rank": 1,
                "main_process_ip": "10.0.0.1",
                "main_process_port": 29600,
            }
        )
    )
    out = cli("launch", "--config_file", str(config), "--dry_run", "train.py")
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip()
        .splitlines()[-1]
        .endswith(
            "--nproc_per_node 4 --nnodes 2 --node_rank 1 --master_addr 10.0.0.1 --master_port 29600 train.py"
        )
    )


def test_bad_config_file_names_the_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("num_procesess: 2\n")
    out = cli("launch", "--config_file", str(config), "--dry_run", "train.py")
    assert (
        out.returncode == 1
        and "unknown keys ['num_procesess']" in out.stderr
        and "Traceback" not in out.stderr
    )
    with pytest.raises(trainer.ConfigurationError, match="main_process_ip"):
        LaunchConfig(num_machines=2)


def test_config_default_and_interactive_and_env(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = cli("config", "--default", env=env)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "cache" / "trainer" / "default_config.yaml"
    assert path.is_file() and yaml.safe_load(path.read_text())["distributed_type"] == "NO"
    answers = (
        "\n".join(
            [
                "1",
                "FSDP",
                "2",
                "yes",
                "bf16",
                "TRANSFORMER_BASED_WRAP",
                "Block",
                "yes",
                "no",
                "FULL_STATE_DICT",
                "no",
                "no",
            ]
        )
        + "\n"
    )
    target = tmp_path / "fsdp.yaml"
    out = cli("config", "--config_file", str(target), stdin=answers)
    assert out.returncode == 0, out.stdout + out.stderr
    written = yaml.safe_load(target.read_text())
    assert (
        written["distributed_type"] == "FSDP"
        and written["num_processes"] == 2
        and written["mixed_precision"] == "bf16"
    )
    assert written["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Block"
    assert written["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    shown = cli("env", "--config_file", str(target))
    for key, value in written.items():
        if not isinstance(value, dict | list):
            assert f"  {key}: " in shown.stdout, key
    assert f"config_file: {path}" in cli("env", env=env).stdout  # the default location is read


def test_default_config_path_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_config_path() == tmp_path / "trainer" / "default_config.yaml"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_config_path() == Path.home() / ".cache" / "trainer" / "default_config.yaml"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    assert load_launch_config() == LaunchConfig()


@pytest.mark.distributed
def test_trainer_launch_runs_two_processes_and_auto_picks_ddp(tmp_path):
    out = cli(
        "launch",
        "--num_processes",
        "2",
        "--cpu",
        "--mixed_precision",
        "bf16",
        "tests/distributed/launch_target.py",
        str(tmp_path),
        env={"XDG_CACHE_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [f["world_size"] for f in facts] == [2, 2] and [f["strategy"] for f in facts] == [
        "DDPStrategy"
    ] * 2
    assert [f["mixed_precision"] for f in facts] == ["bf16", "bf16"]
    assert [f["steps"] for f in facts] == [4, 4]  # 32 samples / (4 x 2)


@pytest.mark.distributed
def test_trainer_with_devices_two_relaunches_itself_under_torchrun(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAINER_TEST_DEVICES": "2"}
    out = subprocess.run(
        [sys.executable, "tests/distributed/launch_target.py", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trainer: starting 2 processes" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json"]


@pytest.mark.distributed
def test_trainer_test_self_check(tmp_path):
    config = tmp_path / "cpu.yaml"
    config.write_text(
        yaml.safe_dump({"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True})
    )
    out = cli("test", "--config_file", str(config))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "self-check passed: 2 processes, MULTI_CPU" in out.stdout


def _rank_and_sum(value: float):
    import torch

    accelerator = trainer.Accelerator(cpu=True)
    return accelerator.process_index, float(
        accelerator.reduce(torch.tensor(value + accelerator.process_index), "sum")
    )


@pytest.mark.distributed
def test_debug_and_notebook_launchers_run_a_function_on_two_processes():
    assert trainer.debug_launcher(_rank_and_sum, args=(1.0,), num_processes=2) == {
        0: (0, 3.0),
        1: (1, 3.0),
    }
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert trainer.notebook_launcher(
        _rank_and_sum, args=(0.0,), num_processes=2, use_port=port
    ) == {0: (0, 1.0), 1: (1, 1.0)}


def test_a_signal_after_the_processes_ended_leaves_their_status_to_torchrun():
    """`trainer launch` exited 0 on a second SIGTERM that came after its processes had ended but
    before torchrun's agent collected their status (an ended process's environment cannot be
    read, so none was found): a job whose rank died was reported as a clean preemption."""
    import signal
    import time

    from trainer.accelerator.launchers import _pass_on_preemption_signals

    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    deadline = time.monotonic() + 60
    stat = Path(f"/proc/{ended.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    previous = _pass_on_preemption_signals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here; it raised SystemExit(0)
        time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert ended.wait() == 1  # still there for the agent to report
