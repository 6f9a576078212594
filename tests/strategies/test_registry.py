"""The strategy registry and the single-device strategy's verbs."""

from __future__ import annotations

import pytest
import torch

from trainer import ConfigurationError
from trainer.precision import HalfPrecision
from trainer.strategies import (
    STRATEGY_REGISTRY,
    SingleDeviceStrategy,
    Strategy,
    register_strategy,
    resolve_strategy,
)


def test_auto_and_single_resolve_to_single_device():
    assert type(resolve_strategy("auto", device="cpu")) is SingleDeviceStrategy
    assert type(resolve_strategy("single", device="cpu")) is SingleDeviceStrategy
    instance = SingleDeviceStrategy("cpu")
    assert resolve_strategy(instance) is instance


def test_unknown_name_lists_registered_names():
    with pytest.raises(ConfigurationError, match=r"'auto', 'single'"):
        resolve_strategy("megatronn")


def test_register_a_new_strategy_by_name():
    class Mine(Strategy):
        name = "mine"

    register_strategy("mine", Mine)
    try:
        assert type(resolve_strategy("mine")) is Mine
    finally:
        del STRATEGY_REGISTRY["mine"]


def test_single_device_verbs():
    strategy = SingleDeviceStrategy("cpu", precision=HalfPrecision("bf16-true"))
    strategy.setup_environment()
    module = strategy.setup_module(torch.nn.Linear(2, 2))
    assert module.weight.dtype == torch.bfloat16
    assert strategy.world_size == 1 and strategy.is_global_zero
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}
    tensor = torch.tensor([1.0, 2.0])
    assert strategy.all_reduce(tensor) is tensor
    assert strategy.all_gather(tensor).shape == (1, 2)
    assert strategy.broadcast("x") == "x"
    with strategy.no_backward_sync(module):
        pass
    state = strategy.module_state_dict(module)
    strategy.load_module_state_dict(module, state)
    assert "cpu" in repr(strategy) and "bf16-true" in repr(strategy)


def test_every_strategy_takes_lightnings_collective_arguments():
    """XLA's ``all_gather(tensor)`` / ``barrier()`` and Megatron's / ModelParallel's
    ``all_gather(tensor)`` refused Lightning's ``group`` / ``sync_grads`` / ``name`` (TypeError
    in a ported hook); the rest took them."""
    import importlib
    import inspect

    classes = {
        getattr(importlib.import_module(path.split(":")[0]), path.split(":")[1])
        for path in STRATEGY_REGISTRY.values()
        if isinstance(path, str)
    }
    assert len(classes) == 7, classes
    for cls in classes:
        signatures = {
            verb: list(inspect.signature(getattr(cls, verb)).parameters)[1:]
            for verb in ("all_gather", "barrier", "reduce", "broadcast")
        }
        assert signatures == {
            "all_gather": ["tensor", "group", "sync_grads"],
            "barrier": ["name"],
            "reduce": ["tensor", "group", "reduce_op"],
            "broadcast": ["obj", "src"],
        }, cls.__name__
