"""DeepSpeedStrategy without processes: the config it builds, what it fills in, what it refuses,
and MissingDependencyError when DeepSpeed cannot be imported (nothing here imports DeepSpeed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.errors import (
    CheckpointError,
    ConfigurationError,
    MissingDependencyError,
    StrategyError,
)
from trainer.precision import resolve_precision
from trainer.runtime.state import DistributedType
from trainer.strategies import STRATEGY_REGISTRY, resolve_strategy
from trainer.strategies.deepspeed import DeepSpeedStrategy
from trainer.strategies.deepspeed_checkpoint import _key_prefix

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("deepspeed"), reason="deepspeed is not installed"
)


def strategy(precision: str = "32-true", **kwargs) -> DeepSpeedStrategy:
    built = DeepSpeedStrategy("cpu", **kwargs)
    built.precision = resolve_precision(precision)
    return built


def test_registered_under_its_name_and_the_defaults_are_zero2():
    assert STRATEGY_REGISTRY["deepspeed"] == "trainer.strategies.deepspeed:DeepSpeedStrategy"
    built = resolve_strategy("deepspeed", accelerator="cpu")
    assert type(built) is DeepSpeedStrategy and built.zero_stage == 2
    assert built.distributed_type == DistributedType.DEEPSPEED
    config = built.engine_config()
    assert config["zero_optimization"] == {
        "stage": 2, "contiguous_gradients": True, "overlap_comm": True,
        "allgather_partitions": True, "reduce_scatter": True,
        "allgather_bucket_size": 200_000_000, "reduce_bucket_size": 200_000_000,
        "sub_group_size": 1_000_000_000_000,
    }  # fmt: skip
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["gradient_accumulation_steps"] == 1
    assert config["managed_gradient_accumulation"] is False
    assert config["zero_allow_untested_optimizer"] is True
    assert "bf16" not in config and "fp16" not in config


def test_unset_clipping_becomes_zero_not_deepspeeds_default_of_one():
    assert strategy().engine_config()["gradient_clipping"] == 0.0


def test_batch_size_comes_from_the_train_loader_unless_stated():
    built = strategy()
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=5)
    assert built.process_dataloader(loader) is loader
    built.process_dataloader(torch.utils.data.DataLoader(list(range(10)), batch_size=3))  # val
    assert built.engine_config()["train_micro_batch_size_per_gpu"] == 5
    assert built.engine_config(micro_batch_size=7)["train_micro_batch_size_per_gpu"] == 7
    assert strategy(logging_batch_size_per_gpu=6).engine_config()["train_micro_batch_size_per_gpu"] == 6  # fmt: skip
    stated = strategy(config={"train_micro_batch_size_per_gpu": 4})
    stated.process_dataloader(loader)
    assert stated.engine_config()["train_micro_batch_size_per_gpu"] == 4


@pytest.mark.parametrize(
    ("precision", "section"),
    [("bf16-mixed", "bf16"), ("bf16-true", "bf16"), ("32-true", None)],
)
def test_precision_fills_the_bf16_section(precision, section):
    config = strategy(precision).engine_config()
    assert config.get("bf16") == ({"enabled": True} if section else None)
    assert "fp16" not in config


def test_fp16_section_carries_loss_scaling_on_a_gpu():
    built = DeepSpeedStrategy("cuda", loss_scale=0, initial_scale_power=12, hysteresis=3)
    built.precision = resolve_precision("16-mixed")
    assert built.engine_config()["fp16"] == {
        "enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 1000,
        "hysteresis": 3, "min_loss_scale": 1,
    }  # fmt: skip


@pytest.mark.parametrize(("precision", "match"), [("16-mixed", "needs a GPU"), ("64-true", "no DeepSpeed mode")])  # fmt: skip
def test_precisions_deepspeed_cannot_run_are_refused_early(precision, match):
    with pytest.raises(ConfigurationError, match=match):
        strategy(precision).engine_config()


def test_a_partial_user_config_is_filled_and_its_values_win():
    built = strategy(
        "bf16-mixed",
        stage=3,
        offload_optimizer=True,
        config={"zero_optimization": {"reduce_bucket_size": 1000, "stage3_max_live_parameters": 5}, "bf16": {"enabled": "auto"}, "gradient_clipping": "auto"},
    )  # fmt: skip
    built.process_dataloader(torch.utils.data.DataLoader(list(range(8)), batch_size=8))
    config = built.engine_config()
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["reduce_bucket_size"] == 1000
    assert zero["stage3_max_live_parameters"] == 5 and zero["overlap_comm"] is True
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert config["zero_force_ds_cpu_optimizer"] is False  # the user's torch optimizer is kept
    assert config["bf16"] == {"enabled": True}
    assert config["gradient_clipping"] == 0.0 and config["train_micro_batch_size_per_gpu"] == 8
    assert built.config["bf16"] == {"enabled": "auto"}  # building the engine config copies


def test_stages_0_and_1_leave_overlap_comm_out():
    for stage in (0, 1):
        assert "overlap_comm" not in strategy(stage=stage).engine_config()["zero_optimization"]
    assert "zero_optimization" not in strategy(zero_optimization=False).engine_config()


def test_config_from_a_json_file_and_from_trainer_launch(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}))
    built = strategy(config=str(path))
    assert built.zero_stage == 1 and built.engine_config()["gradient_clipping"] == 0.5
    monkeypatch.setenv("TRAINER_DEEPSPEED_CONFIG", json.dumps({"zero_optimization": {"stage": 3}}))
    assert strategy().zero_stage == 3


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"optimizer": {"type": "Adam"}}, "comes from configure_optimizers"),
        ({"scheduler": {"type": "WarmupLR"}}, "lr_scheduler"),
        ({"gradient_accumulation_steps": 4}, r"accumulate_grad_batches=N"),
        ({"train_batch_size": 64}, "the DataLoader's batch_size"),
        ([1, 2], "expected a dict or a JSON file path"),
        ("/no/such/ds.json", "no such file"),
    ],
)
def test_config_keys_the_trainer_owns_are_refused_with_the_fix(config, match):
    with pytest.raises(ConfigurationError, match=match):
        DeepSpeedStrategy("cpu", config=config)


def test_a_precision_section_that_disagrees_names_the_fix():
    with pytest.raises(ConfigurationError, match="State the precision once"):
        strategy("32-true", config={"bf16": {"enabled": True}}).engine_config()
    with pytest.raises(ConfigurationError, match="disagrees with precision='bf16-mixed'"):
        strategy("bf16-mixed", config={"bf16": {"enabled": False}}).engine_config()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stage": 4}, "expected a ZeRO stage 0, 1, 2 or 3"),
        ({"offload_parameters": True, "stage": 2}, "Set stage=3"),
        ({"offload_optimizer": True, "stage": 0}, "needs ZeRO stage 1, 2 or 3"),
        (
            {"offload_optimizer": True, "offload_optimizer_device": "disk"},
            "expected 'cpu' or 'nvme'",
        ),
        (
            {"offload_parameters": True, "stage": 3, "offload_params_device": "nvme"},
            "needs nvme_path",
        ),
        ({"logging_batch_size_per_gpu": 0}, "expected 'auto' or a positive int"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        DeepSpeedStrategy("cpu", **kwargs)


def test_nvme_offload_carries_the_path():
    built = strategy(stage=3, offload_parameters=True, offload_params_device="nvme", nvme_path="/nvme")  # fmt: skip
    assert built.engine_config()["zero_optimization"]["offload_param"] == {
        "device": "nvme", "pin_memory": False, "nvme_path": "/nvme",
    }  # fmt: skip


def test_clipping_stated_twice_and_other_norms_are_refused_before_any_engine():
    built = strategy(config={"gradient_clipping": 1.0})
    with pytest.raises(ConfigurationError, match="stated twice"):
        built.clip_grad_norm_(None, [], 0.5)
    with pytest.raises(ConfigurationError, match="2-norm only"):
        built.clip_grad_norm_(None, [], 1.0, norm_type=1.0)
    with pytest.raises(StrategyError, match="no DeepSpeed engine yet"):
        built.clip_grad_norm_(None, [], 1.0)


def test_training_verbs_before_the_optimizer_is_prepared_say_what_to_do():
    with pytest.raises(StrategyError, match=r"accelerator.prepare\(model, optimizer"):
        strategy().backward(torch.tensor(1.0, requires_grad=True), None)


def test_key_prefix_of_the_trainers_step_router():
    engine_keys = ["module.net.0.weight", "module.net.0.bias"]
    assert _key_prefix(engine_keys, ["net.0.weight", "net.0.bias"]) == "module."
    assert _key_prefix(["net.0.weight"], ["net.0.weight"]) == ""
    assert _key_prefix(engine_keys, []) == ""


def test_missing_deepspeed_raises_missing_dependency_naming_the_extra():
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"
        "import trainer\n"
        "from trainer.strategies import DeepSpeedStrategy\n"
        "for build in (lambda: DeepSpeedStrategy(), lambda: trainer.Trainer(strategy='deepspeed', accelerator='cpu')):\n"
        "    try:\n"
        "        build()\n"
        "    except trainer.MissingDependencyError as err:\n"
        "        print('MissingDependencyError:', err)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert "DeepSpeedStrategy needs the package 'deepspeed'" in line
        assert "pip install 'trainer[deepspeed]'" in line
    assert issubclass(MissingDependencyError, ImportError)


def test_optimizer_state_is_a_placeholder_and_foreign_states_are_refused_with_the_fix():
    built = strategy(stage=3)
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    placeholder = built.optimizer_state_dict(optimizer)
    assert placeholder == {"saved_by": "deepspeed", "zero_stage": 3}
    with pytest.raises(CheckpointError, match="lives in DeepSpeed's shards"):
        built.load_optimizer_state_dict(optimizer, placeholder)  # not restored by an engine
    with pytest.raises(CheckpointError, match="load only the weights"):
        built.load_optimizer_state_dict(optimizer, optimizer.state_dict())
