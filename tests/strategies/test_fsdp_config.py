"""Accelerate-style fsdp_config parsing (no processes needed)."""

from __future__ import annotations

import json

import pytest
import torch

from trainer import ConfigurationError
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.fsdp_config import parse_fsdp_config

ACCELERATE_EXAMPLE = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
use_cpu: false
"""


def test_accelerate_example_config_maps_correctly(tmp_path):
    path = tmp_path / "fsdp_llama.yaml"
    path.write_text(ACCELERATE_EXAMPLE)
    parsed = parse_fsdp_config(path)
    assert parsed == {
        "ignored": [], "auto_wrap_policy": {"LlamaDecoderLayer"}, "reshard_after_forward": True, "cpu_offload": False,
        "cpu_ram_efficient_loading": True, "activation_checkpointing": False, "state_dict_type": "SHARDED",
        "mixed_precision": "bf16",
    }  # fmt: skip
    from trainer.accelerator.launch_config import load_launch_config

    launch = load_launch_config(path)
    assert (
        launch.strategy == "fsdp" and launch.num_processes == 4 and launch.mixed_precision == "bf16"
    )


def test_the_strategy_takes_the_config_and_arguments_win():
    strategy = FSDPStrategy(
        "cpu",
        fsdp_config={
            "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
            "fsdp_min_num_params": 1000,
            "fsdp_state_dict_type": "FULL_STATE_DICT",
        },
        state_dict_type="SHARDED",
    )
    assert (
        strategy.auto_wrap_policy == "size"
        and strategy.min_num_params == 1000
        and strategy.state_dict_type == "SHARDED"
    )
    json_config = json.dumps({"fsdp_cpu_offload": True, "fsdp_backward_prefetch": "BACKWARD_PRE"})
    strategy = FSDPStrategy("cpu", fsdp_config=json_config)
    assert strategy.cpu_offload and strategy.ignored_config_keys == ["fsdp_backward_prefetch"]


def test_size_based_policy_picks_large_modules_bottom_up():
    strategy = FSDPStrategy("cpu", auto_wrap_policy="size", min_num_params=100)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 10), torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(2, 2))
    )
    chosen = strategy._layers_to_shard(model)
    assert [type(m).__name__ for m in chosen] == [
        "Linear",
        "Linear",
    ]  # 220 and 110 params; the tiny one is left to the root
    assert {m.out_features for m in chosen} == {20, 10}


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"fsdp_version": 1}, "fsdp_version: 2"),
        (
            {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"},
            "needs fsdp_transformer_layer_cls_to_wrap",
        ),
        ({"fsdp_auto_wrap_policy": "BY_MAGIC"}, "fsdp_auto_wrap_policy='BY_MAGIC'"),
        ({"fsdp_state_dict_type": "LOCAL_STATE_DICT"}, "FULL_STATE_DICT or SHARDED_STATE_DICT"),
        ({"fsdp_offload_parms": True}, r"unknown keys \['fsdp_offload_parms'\]"),
        ({"fsdp_cpu_offload": "maybe"}, "expected true or false"),
    ],
)
def test_bad_configs_are_named(config, match):
    with pytest.raises(ConfigurationError, match=match):
        parse_fsdp_config(config)


def test_strategy_argument_errors():
    with pytest.raises(ConfigurationError, match="state_dict_type='LOCAL'"):
        FSDPStrategy("cpu", state_dict_type="LOCAL")
    with pytest.raises(ConfigurationError, match="auto_wrap_policy='everything'"):
        FSDPStrategy("cpu", auto_wrap_policy="everything")
