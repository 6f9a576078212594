"""Where and how processes and devices run: the Strategy classes and the name registry.

A new engine is one new file here plus one line in ``STRATEGY_REGISTRY``; nothing outside this
package asks which strategy runs. Engines whose library is heavy are imported only when chosen.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trainer.errors import ConfigurationError, describe
from trainer.strategies.environment import ClusterEnvironment, SLURMEnvironment, detect_environment
from trainer.strategies.single import SingleDeviceStrategy
from trainer.strategies.strategy import Strategy

__all__ = [
    "STRATEGY_REGISTRY",
    "ClusterEnvironment",
    "DDPStrategy",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "MegatronStrategy",
    "ModelParallelStrategy",
    "SLURMEnvironment",
    "SingleDeviceStrategy",
    "Strategy",
    "XLAStrategy",
    "detect_environment",
    "distributed_type_strategies",
    "register_strategy",
    "resolve_strategy",
]


def _ddp_finding_unused(**kwargs: Any) -> Strategy:
    """Lightning's strategy="ddp_find_unused_parameters_true"."""
    from trainer.strategies.ddp import DDPStrategy

    return DDPStrategy(find_unused_parameters=True, **kwargs)


# name -> "module:Class" (imported on use) or a factory
STRATEGY_REGISTRY: dict[str, str | Callable[..., Strategy]] = {
    "single": "trainer.strategies.single:SingleDeviceStrategy",
    "ddp": "trainer.strategies.ddp:DDPStrategy",
    "ddp_find_unused_parameters_false": "trainer.strategies.ddp:DDPStrategy",  # Lightning's
    "ddp_find_unused_parameters_true": _ddp_finding_unused,
    "deepspeed": "trainer.strategies.deepspeed:DeepSpeedStrategy",
    "fsdp": "trainer.strategies.fsdp:FSDPStrategy",
    "megatron": "trainer.strategies.megatron:MegatronStrategy",
    "model_parallel": "trainer.strategies.model_parallel:ModelParallelStrategy",
    "xla": "trainer.strategies.xla:XLAStrategy",
}


def register_strategy(name: str, target: str | Callable[..., Strategy]) -> None:
    """Make ``strategy=name`` build ``target`` ("package.module:Class" or a factory)."""
    STRATEGY_REGISTRY[name] = target


def distributed_type_strategies() -> dict[str, str]:
    """Each Accelerate launch-config ``distributed_type`` and the registered strategy it starts.

    ``trainer launch`` tells the launched processes this name (``TRAINER_STRATEGY``). A strategy
    no ``distributed_type`` maps to (``"model_parallel"``, or one added with `register_strategy`)
    is chosen by its name instead: ``trainer launch --strategy``, or ``strategy:`` in the file.

    Examples:
        >>> distributed_type_strategies()["MEGATRON_LM"]
        'megatron'
    """
    return {
        "NO": "single",
        "MULTI_CPU": "ddp",
        "MULTI_GPU": "ddp",
        "FSDP": "fsdp",
        "DEEPSPEED": "deepspeed",
        "MEGATRON_LM": "megatron",
        "XLA": "xla",
    }


def auto_strategy_name() -> str:
    """What the launcher asked for (``trainer launch`` sets TRAINER_STRATEGY), else by world size."""
    import os

    chosen = os.environ.get("TRAINER_STRATEGY")
    if chosen:
        return chosen
    return "ddp" if detect_environment().is_distributed else "single"


def resolve_strategy(
    strategy: str | Strategy | None, *, argument: str = "strategy", **kwargs: Any
) -> Strategy:
    """Return a Strategy for a registered name or an instance.

    ``kwargs`` (``device=...``) are passed to the class when a name is given.

    Raises:
        ConfigurationError: for a name that is not registered, listing the valid ones.
    """
    if isinstance(strategy, Strategy):
        return strategy
    name = auto_strategy_name() if strategy in (None, "auto") else strategy
    target = STRATEGY_REGISTRY.get(name) if isinstance(name, str) else None
    if target is None:
        valid = ", ".join(repr(n) for n in ("auto", *STRATEGY_REGISTRY))
        raise ConfigurationError(
            f"{argument}={describe(strategy)} is not a known strategy. Expected one of {valid}, "
            "or a trainer.strategies.Strategy instance."
        )
    if isinstance(target, str):
        module_name, _, class_name = target.partition(":")
        target = getattr(importlib.import_module(module_name), class_name)
    return target(**kwargs)


def __getattr__(name: str) -> Any:
    if name == "DDPStrategy":
        from trainer.strategies.ddp import DDPStrategy

        return DDPStrategy
    if name == "DeepSpeedStrategy":
        from trainer.strategies.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy
    if name == "FSDPStrategy":
        from trainer.strategies.fsdp import FSDPStrategy

        return FSDPStrategy
    if name == "MegatronStrategy":
        from trainer.strategies.megatron import MegatronStrategy

        return MegatronStrategy
    if name == "ModelParallelStrategy":
        from trainer.strategies.model_parallel import ModelParallelStrategy

        return ModelParallelStrategy
    if name == "XLAStrategy":
        from trainer.strategies.xla import XLAStrategy

        return XLAStrategy
    raise AttributeError(f"module 'trainer.strategies' has no attribute {name!r}")
