"""The launch config's keys and engines: every registered strategy reaches `trainer launch`,
`trainer config` and `trainer estimate-memory`, and every key is acted on or refused by name."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path

import pytest
import yaml

from trainer import ConfigurationError
from trainer.accelerator.launch_config import (
    DISTRIBUTED_TYPES,
    LaunchConfig,
    load_launch_config,
    write_launch_config,
)
from trainer.accelerator.launchers import launch_environment, torchrun_command
from trainer.cli.launch import resolve_config
from trainer.cli.main import build_parser, main
from trainer.strategies import STRATEGY_REGISTRY, distributed_type_strategies

ENGINES = sorted(STRATEGY_REGISTRY)


@pytest.fixture(autouse=True)
def _no_default_config(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no user config is read


def _write(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "MULTI_CPU", "num_processes": 2, **keys}))
    return path


def _dry_run(capsys, *flags: str) -> tuple[int, dict[str, str], str]:
    status = main(["launch", *flags, "--dry_run", "train.py"])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    env = dict(line.split("=", 1) for line in lines[:-1])
    return status, env, (lines[-1] if lines else "") + captured.err


# ---- engines come from the registry ---------------------------------------------------------
def test_every_distributed_type_starts_a_registered_strategy():
    assert set(DISTRIBUTED_TYPES) == set(distributed_type_strategies())
    assert set(distributed_type_strategies().values()) <= set(STRATEGY_REGISTRY)
    for kind, name in distributed_type_strategies().items():
        assert LaunchConfig(distributed_type=kind).strategy == name


@pytest.mark.parametrize("name", ENGINES)
def test_trainer_launch_accepts_every_registered_strategy(name, capsys):
    processes = "1" if name == "single" else "2"  # single with 2 processes runs DDP, as before
    status, env, text = _dry_run(capsys, "--strategy", name, "--num_processes", processes, "--cpu")
    assert status == 0, text
    assert env["TRAINER_STRATEGY"] == name


@pytest.mark.parametrize("name", ENGINES)
def test_trainer_config_offers_every_registered_strategy(name, monkeypatch, tmp_path, capsys):
    processes = "1" if name == "single" else "2"  # NO with 2 processes runs DDP
    answers = iter(["1", name, processes, "yes", "no"])  # machines, strategy, processes, cpu, ...
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(answers, ""))  # FSDP: defaults
    target = tmp_path / "written.yaml"
    status = main(["config", "--config_file", str(target)])
    assert status == 0 and "launch config written" in capsys.readouterr().out
    assert load_launch_config(target).strategy == name
    status, env, text = _dry_run(capsys, "--config_file", str(target))
    assert status == 0 and env["TRAINER_STRATEGY"] == name, text


@pytest.mark.parametrize("name", ENGINES)
def test_estimate_memory_accepts_every_registered_strategy(name, tmp_path, monkeypatch, capsys):
    (tmp_path / "em_engines.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(10, 10)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "em_engines", raising=False)
    processes = "1" if name == "single" else "2"
    flags = ["--strategy", name, "--num_processes", processes, "--dtypes", "float32"]
    assert main(["estimate-memory", "em_engines:make", *flags]) == 0, capsys.readouterr().err
    words = " ".join(capsys.readouterr().out.replace("│", " ").split())  # long names wrap
    assert f"training, per process: {name}" in words


def test_a_strategy_no_distributed_type_starts_is_written_by_name(tmp_path):
    path = write_launch_config(
        LaunchConfig(distributed_type="MULTI_GPU", strategy="model_parallel", num_processes=4),
        tmp_path / "tp.yaml",
    )
    assert yaml.safe_load(path.read_text())["strategy"] == "model_parallel"
    assert load_launch_config(path).strategy == "model_parallel"
    implied = write_launch_config(LaunchConfig(distributed_type="FSDP"), tmp_path / "fsdp.yaml")
    assert "strategy" not in yaml.safe_load(implied.read_text())  # still Accelerate's shape


def test_unregistered_strategy_key_is_refused_with_the_valid_names(tmp_path):
    path = _write(tmp_path, strategy="zero3")
    with pytest.raises(ConfigurationError, match=rf"{path}: strategy='zero3'.*'model_parallel'"):
        load_launch_config(path)


def test_strategy_flag_sets_the_distributed_type_that_starts_it(tmp_path, capsys):
    path = _write(tmp_path, distributed_type="NO", num_processes=1)
    for name, kind in (("single", "NO"), ("fsdp", "FSDP"), ("megatron", "MEGATRON_LM")):
        args = build_parser().parse_args(
            ["launch", "--config_file", str(path), "--strategy", name, "train.py"]
        )
        config = resolve_config(args)
        assert (config.distributed_type, config.strategy) == (kind, name)
    status, env, _ = _dry_run(capsys, "--config_file", str(path), "--num_processes", "2")
    assert status == 0 and env["TRAINER_STRATEGY"] == "ddp"  # NO with 2 processes runs DDP


# ---- every key is used or refused ------------------------------------------------------------
REFUSED = {
    "compute_environment": ("AMAZON_SAGEMAKER", "compute_environment: LOCAL_MACHINE"),
    "debug": (True, "debug: false"),
    "downcast_bf16": ("yes", "downcast_bf16: 'no'"),
    "enable_cpu_affinity": (True, "enable_cpu_affinity: false"),
    "main_training_function": ("train", "main_training_function: main"),
    "tpu_env": (["A=1"], "tpu_env: []"),
    "tpu_use_cluster": (True, "tpu_use_cluster: false"),
    "tpu_use_sudo": (True, "tpu_use_sudo: false"),
    "megatron_lm_config": ({"megatron_lm_tp_degree": 2}, "remove megatron_lm_config"),
    "dynamo_config": ({"dynamo_backend": "INDUCTOR"}, "remove dynamo_config"),
}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_key_launch_would_not_act_on_is_refused_naming_key_file_and_fix(key, tmp_path, capsys):
    value, fix = REFUSED[key]
    path = _write(tmp_path, **{key: value})
    with pytest.raises(ConfigurationError) as caught:
        load_launch_config(path)
    message = str(caught.value)
    assert (
        message.startswith(f"launch config file {path}: {key}=") and fix.lower() in message.lower()
    )
    status, _, text = _dry_run(capsys, "--config_file", str(path))
    assert status == 1 and f"{key}=" in text and "Traceback" not in text


def test_every_key_is_acted_on_or_refused():
    acted_on = {
        "distributed_type", "strategy", "mixed_precision", "num_machines", "num_processes",
        "machine_rank", "main_process_ip", "main_process_port", "rdzv_backend", "same_network",
        "use_cpu", "gpu_ids", "fsdp_config", "deepspeed_config",
    }  # fmt: skip
    assert set(LaunchConfig().to_dict()) | {"strategy"} == acted_on | set(REFUSED)


def test_accelerate_off_values_are_accepted(tmp_path):
    path = tmp_path / "accelerate.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_GPU\n"
        "downcast_bf16: no\nenable_cpu_affinity: false\ngpu_ids: all\nmachine_rank: 0\n"
        "main_training_function: main\nmixed_precision: bf16\nnum_machines: 1\nnum_processes: 2\n"
        "rdzv_backend: static\nsame_network: true\ntpu_env: []\ntpu_use_cluster: false\n"
        "tpu_use_sudo: false\nuse_cpu: false\ndynamo_config:\n  dynamo_backend: 'NO'\n"
        "megatron_lm_config: {}\n"
    )
    assert load_launch_config(path).strategy == "ddp"


def test_dynamo_config_refusal_gives_the_trainer_compile_options(tmp_path):
    dynamo = {
        "dynamo_backend": "INDUCTOR",
        "dynamo_mode": "max-autotune",
        "dynamo_use_fullgraph": True,
        "dynamo_use_dynamic": False,
    }
    with pytest.raises(ConfigurationError) as caught:
        load_launch_config(_write(tmp_path, dynamo_config=dynamo))
    assert (
        "Trainer(compile={'backend': 'inductor', 'mode': 'max-autotune', 'fullgraph': True})"
        in str(caught.value)
    )
    assert "Accelerator(dynamo_backend='inductor')" in str(caught.value)


def test_megatron_lm_config_refusal_gives_the_megatron_strategy_call(tmp_path):
    megatron = {
        "megatron_lm_tp_degree": 2,
        "megatron_lm_pp_degree": 1,
        "megatron_lm_sequence_parallelism": True,
        "megatron_lm_gradient_clipping": 1.0,
        "megatron_lm_num_micro_batches": 4,
    }
    path = _write(tmp_path, distributed_type="MEGATRON_LM", megatron_lm_config=megatron)
    with pytest.raises(ConfigurationError) as caught:
        load_launch_config(path)
    message = str(caught.value)
    assert (
        "Trainer(strategy=MegatronStrategy(tensor_model_parallel_size=2, "
        "pipeline_model_parallel_size=1, sequence_parallel=True), gradient_clip_val=1.0)"
    ) in message
    assert "['megatron_lm_num_micro_batches'] have no MegatronStrategy option" in message


def test_engine_options_for_another_strategy_are_refused(tmp_path, capsys):
    path = _write(tmp_path, distributed_type="FSDP", fsdp_config={"fsdp_version": 2})
    status, env, _ = _dry_run(capsys, "--config_file", str(path))
    assert status == 0 and env["TRAINER_STRATEGY"] == "fsdp" and "TRAINER_FSDP_CONFIG" in env
    for name in ("ddp", "model_parallel"):
        status, _, text = _dry_run(capsys, "--config_file", str(path), "--strategy", name)
        assert status == 1 and "fsdp_config is read only by the 'fsdp' strategy" in text
        assert f"launches '{name}'" in text and "with the command-line flags" in text
    with pytest.raises(
        ConfigurationError, match="deepspeed_config is read only by the 'deepspeed'"
    ):
        load_launch_config(_write(tmp_path, deepspeed_config={"zero_stage": 2}))


def test_gpu_ids_select_the_visible_gpus():
    assert launch_environment(LaunchConfig(gpu_ids="0, 2"))["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert "CUDA_VISIBLE_DEVICES" not in launch_environment(LaunchConfig(gpu_ids="all"))
    assert launch_environment(LaunchConfig(gpu_ids="1", use_cpu=True))["CUDA_VISIBLE_DEVICES"] == ""


def test_same_network_false_meets_at_the_rendezvous_endpoint():
    layout = {
        "num_machines": 2,
        "num_processes": 2,
        "machine_rank": 1,
        "main_process_ip": "10.0.0.1",
    }
    same = " ".join(torchrun_command(LaunchConfig(**layout), "train.py", []))
    assert "--master_addr 10.0.0.1 --master_port 29500 train.py" in same
    apart = " ".join(torchrun_command(LaunchConfig(**layout, same_network=False), "train.py", []))
    assert "--master_addr" not in apart
    assert "--rdzv_backend static --rdzv_endpoint 10.0.0.1:29500 train.py" in apart
