"""`trainer launch` on several machines: Accelerate's meaning of num_processes, and parity with
`accelerate launch` on the torchrun command both build (issue #18, items 1 and 5).

`accelerate launch` runs torchrun in its own process (``torch.distributed.run.run(args)``); with
that function replaced by a recorder it is a dry run, and the arguments it would have run are
compared with the command ``trainer launch --dry_run`` prints, parsed by torchrun's own parser.
Compared: the world size, processes per machine, machines, this machine's rank and where they
meet. Not compared: the rendezvous backend — accelerate 1.15 never reads a file's
``rdzv_backend`` or ``same_network`` (its flags' defaults win), ``trainer launch`` does.
"""

from __future__ import annotations

import builtins
import socket

import pytest
import yaml

from trainer import ConfigurationError
from trainer.accelerator.launch_config import LaunchConfig, load_launch_config
from trainer.cli.main import main

pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def _no_default_config(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no user config is read


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _layout(args) -> dict[str, object]:
    """What a torchrun run means: processes per machine, machines, this machine, where they meet."""
    from torch.distributed.run import get_rdzv_endpoint, parse_min_max_nnodes

    nproc, nnodes = int(args.nproc_per_node), parse_min_max_nnodes(args.nnodes)[1]
    layout = {"world_size": nproc * nnodes, "nproc_per_node": nproc, "nnodes": nnodes}
    if nnodes > 1:
        layout["endpoint"] = get_rdzv_endpoint(args)
        if args.rdzv_backend == "static":  # other backends number the machines as they join
            layout["node_rank"] = int(args.node_rank)
    return layout


def _trainer_layout(capsys, *flags: str) -> dict[str, object]:
    from torch.distributed.run import parse_args

    assert main(["launch", *flags, "--dry_run", "train.py"]) == 0, capsys.readouterr().err
    command = capsys.readouterr().out.strip().splitlines()[-1].split()
    return _layout(parse_args(command[command.index("torch.distributed.run") + 1 :]))


def _accelerate_layout(monkeypatch, *flags: str) -> dict[str, object]:
    import torch.distributed.run as torchrun
    from accelerate.commands.launch import launch_command, launch_command_parser

    recorded = []
    monkeypatch.setattr(torchrun, "run", recorded.append)
    launch_command(launch_command_parser().parse_args([*flags, "train.py"]))
    assert len(recorded) == 1, "accelerate launch did not go through torchrun"
    return _layout(recorded[0])


def _config(tmp_path, **keys) -> str:
    path = tmp_path / "accelerate.yaml"
    values = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "mixed_precision": "no",
        "use_cpu": False,
        "gpu_ids": "all",
        "same_network": True,
        "rdzv_backend": "static",
        "main_process_ip": "10.0.0.1",
        "main_process_port": _free_port(),
        **keys,
    }
    path.write_text(yaml.safe_dump(values))
    return str(path)


@pytest.mark.parametrize(
    "keys",
    [
        {"num_machines": 2, "num_processes": 16, "machine_rank": 1},
        {"num_machines": 2, "num_processes": 16, "machine_rank": 0, "rdzv_backend": "c10d"},
        {"num_machines": 4, "num_processes": 8, "machine_rank": 3, "same_network": False},
        {"num_machines": 2, "num_processes": 4, "machine_rank": 1, "distributed_type": "FSDP"},
        {"num_machines": 1, "num_processes": 4, "machine_rank": 0, "main_process_ip": None},
    ],
    ids=["2x8-static", "2x8-c10d", "4x2-apart", "2x2-fsdp", "1x4"],
)
def test_an_accelerate_config_file_runs_the_world_size_accelerate_launch_runs(
    keys, tmp_path, monkeypatch, capsys
):
    path = _config(tmp_path, **keys)
    expected = _accelerate_layout(monkeypatch, "--config_file", path)
    layout = _trainer_layout(capsys, "--config_file", path)
    if keys.get("rdzv_backend") == "c10d":  # honoured here, not by accelerate (see above)
        assert "node_rank" not in layout
        expected.pop("node_rank")
    assert layout == expected
    assert expected["world_size"] == keys["num_processes"]  # the total, not per machine


def test_num_processes_flag_is_the_total_as_in_accelerate_launch(monkeypatch, capsys):
    flags = ["--num_machines", "2", "--num_processes", "16", "--machine_rank", "1"]
    flags += ["--main_process_ip", "10.0.0.1", "--main_process_port", str(_free_port())]
    expected = _accelerate_layout(monkeypatch, "--multi_gpu", *flags)
    assert _trainer_layout(capsys, *flags) == expected
    assert (expected["nproc_per_node"], expected["world_size"]) == (8, 16)


def test_a_total_that_does_not_divide_by_the_machines_names_both_numbers(tmp_path, capsys):
    with pytest.raises(
        ConfigurationError, match=r"num_processes=6 is not a multiple of num_machines=4"
    ):
        LaunchConfig(num_machines=4, num_processes=6, main_process_ip="10.0.0.1")
    path = _config(tmp_path, num_machines=2, num_processes=3, machine_rank=0)
    assert main(["launch", "--config_file", path, "--dry_run", "train.py"]) == 1
    assert "num_processes=3 is not a multiple of num_machines=2" in capsys.readouterr().err
    with pytest.raises(
        ConfigurationError, match=r"machine_rank=2 \(type int\); expected an int from 0 to"
    ):
        LaunchConfig(num_machines=2, num_processes=2, machine_rank=2, main_process_ip="10.0.0.1")


def test_trainer_config_writes_the_total(monkeypatch, tmp_path, capsys):
    asked = []
    answers = iter(["2", "1", "10.0.0.1", "29500", "ddp", "", "yes", "no"])

    def answer(prompt: str = "") -> str:
        asked.append(prompt)
        return next(answers, "")

    monkeypatch.setattr(builtins, "input", answer)
    target = tmp_path / "written.yaml"
    assert main(["config", "--config_file", str(target)]) == 0
    assert any("in total, over all 2 machines" in question for question in asked)
    config = load_launch_config(target)
    assert (config.num_processes, config.processes_per_machine) == (4, 2)  # default: 2 each
    assert main(["launch", "--config_file", str(target), "--dry_run", "train.py"]) == 0
    assert "--nproc_per_node 2 --nnodes 2 --node_rank 1" in capsys.readouterr().out


def test_max_restarts_and_rendezvous_reach_torchrun(capsys):
    flags = ["--num_machines", "2", "--num_processes", "4", "--main_process_ip", "10.0.0.1"]
    assert (
        main(
            ["launch", *flags, "--rdzv_backend", "c10d", "--max_restarts", "3", "--dry_run", "t.py"]
        )
        == 0
    )
    command = capsys.readouterr().out.strip().splitlines()[-1]
    assert command.endswith(
        "--nproc_per_node 2 --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 10.0.0.1:29500 "
        "--max_restarts 3 t.py"
    )
    assert main(["launch", "--max_restarts", "-1", "--dry_run", "t.py"]) == 1
    assert "--max_restarts -1: expected 0 or more" in capsys.readouterr().err
