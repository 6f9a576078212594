"""ParallelismConfig in one process: sizes and their checks, and which strategy runs them.

The layouts themselves run in tests/distributed/test_parallelism.py (2 and 4 processes).
"""

from __future__ import annotations

import pytest
import torch

import trainer
from trainer.accelerator.parallelism import (
    ParallelismConfig,
    maybe_context_parallel,
    strategy_for_parallelism,
)
from trainer.errors import ConfigurationError
from trainer.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy


@pytest.fixture
def two_processes(monkeypatch):
    """What torchrun sets for rank 0 of 2; no process group is started here."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")


def test_sizes_default_to_one_and_read_the_launcher_environment(monkeypatch):
    assert ParallelismConfig().sizes == {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1}
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    config = ParallelismConfig(tp_size=2)
    assert (config.dp_shard_size, config.tp_size, config.total_size) == (4, 2, 8)
    assert (config.data_parallel_size, config.non_data_parallel_size) == (4, 2)


def test_hsdp_dimensions_follow_accelerate():
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert ParallelismConfig(dp_shard_size=2).fsdp_dim_names == ["dp_shard_cp"]
    assert config.dp_replicate_enabled and config.dp_shard_enabled and not config.tp_enabled
    assert config.is_sharded and not ParallelismConfig(dp_replicate_size=2).is_sharded


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"tp_size": 0}, "tp_size=0 (type int)"),
        ({"dp_shard_size": "2"}, "dp_shard_size='2' (type str)"),
        ({"cp_size": True}, "cp_size=True (type bool)"),
    ],
)
def test_bad_sizes_name_the_argument(kwargs, named):
    with pytest.raises(ConfigurationError, match="expected an int >= 1") as info:
        ParallelismConfig(**kwargs)
    assert named in str(info.value)


def test_bad_environment_and_comm_strategy(monkeypatch):
    with pytest.raises(ConfigurationError, match="'ring'"):
        ParallelismConfig(cp_comm_strategy="ring")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(ConfigurationError, match="PARALLELISM_CONFIG_TP_SIZE='two'"):
        ParallelismConfig()


def test_tensor_parallel_with_pure_replication_names_the_fix():
    with pytest.raises(ConfigurationError, match="cannot compose with pure replication") as info:
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    assert "Use dp_shard_size=2 and dp_replicate_size=1" in str(info.value)


def test_one_process_gets_the_single_device_strategy():
    strategy = strategy_for_parallelism(ParallelismConfig(), accelerator="cpu")
    assert type(strategy) is SingleDeviceStrategy
    with maybe_context_parallel(strategy, buffers=[torch.ones(2, 4)], buffer_seq_dims=[1]):
        pass  # no context parallelism: nothing happens


def test_accelerates_parallelism_facts_on_one_process():
    plain = trainer.Accelerator(cpu=True)
    assert plain.torch_device_mesh is None and plain.should_save_model
    for name in ("data_parallel_rank", "data_parallel_shard_rank", "tensor_parallel_rank"):
        with pytest.raises(ConfigurationError, match="parallelism_config=ParallelismConfig"):
            getattr(plain, name)
    configured = trainer.Accelerator(cpu=True, parallelism_config=ParallelismConfig())
    assert configured.data_parallel_rank == configured.context_parallel_rank == 0
    assert configured.should_save_model and not configured.is_composable_parallelism_enabled
    with pytest.raises(NotImplementedError, match="prepare_pippy"):
        configured.pipeline_parallel_rank  # noqa: B018
    buffer = torch.arange(8.0).reshape(2, 4)
    with configured.maybe_context_parallel(buffers=[buffer], buffer_seq_dims=[1]):
        assert buffer.shape == (2, 4)  # no context parallelism: nothing is split


def test_sizes_that_do_not_match_the_job_are_refused(two_processes):
    with pytest.raises(ConfigurationError, match="4 processes, but this job has 2") as info:
        strategy_for_parallelism(ParallelismConfig(dp_shard_size=4), accelerator="cpu")
    assert "--nproc_per_node 4" in str(info.value)


@pytest.mark.parametrize("sizes", [{}, {"dp_replicate_size": 2}])
def test_replication_is_ddp(two_processes, sizes):
    assert (
        type(strategy_for_parallelism(ParallelismConfig(**sizes), accelerator="cpu")) is DDPStrategy
    )


def test_sharding_is_model_parallel_with_the_config_as_layout(two_processes):
    config = ParallelismConfig(dp_shard_size=2)
    strategy = strategy_for_parallelism(
        config, accelerator="cpu", fsdp_options={"reshard_after_forward": False}
    )
    assert isinstance(strategy, ModelParallelStrategy) and strategy.mesh_layout is config
    assert strategy.reshard_after_forward is False
    with pytest.raises(trainer.StrategyError, match="built by setup_environment"):
        _ = strategy.device_mesh


def test_fsdp_options_without_sharding_are_refused(two_processes):
    with pytest.raises(ConfigurationError, match="nothing to shard"):
        strategy_for_parallelism(
            ParallelismConfig(dp_replicate_size=2), accelerator="cpu", fsdp_options={"x": 1}
        )


def test_context_parallel_on_the_cpu_is_refused_with_the_reason(two_processes):
    with pytest.raises(ConfigurationError, match="no context-parallel CPU attention") as info:
        strategy_for_parallelism(ParallelismConfig(cp_size=2), accelerator="cpu")
    assert "set cp_size=1 and give the processes to dp_shard_size" in str(info.value)


def test_a_layout_and_explicit_sizes_do_not_mix():
    with pytest.raises(ConfigurationError, match="the layout sets the sizes"):
        ModelParallelStrategy(
            "cpu", tensor_parallel_size=2, mesh_layout=ParallelismConfig(tp_size=2)
        )
