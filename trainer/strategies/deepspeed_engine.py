"""DeepSpeed the library, and the prepared model its engine runs behind.

What this file owns: the one place DeepSpeed is imported (on the CPU accelerator when asked,
with the version check), the cheap "is it installed" check done at construction, whether ZeRO-3
holds a module's parameters partitioned, and `DeepSpeedModel`, the module ``prepare`` returns
before the engine exists.

What it does not own: when the engine is built and how it is driven (``deepspeed.py``), its
config (``deepspeed_config.py``) and its checkpoint files (``deepspeed_checkpoint.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from trainer.errors import StrategyError

__all__ = [
    "DeepSpeedModel",
    "check_installed",
    "import_deepspeed",
    "initialize_engine",
    "is_partitioned",
    "set_clipping",
]

_MIN_VERSION = (0, 19, 4)  # the first release with managed_gradient_accumulation=false


class DeepSpeedModel(torch.nn.Module):
    """The prepared model: its forward runs through the DeepSpeed engine once that exists.

    The Accelerator prepares models before optimizers, and DeepSpeed builds its engine from both,
    so ``prepare`` returns this wrapper and ``setup_optimizer`` binds the engine to it
    (``model.engine``, None until then: evaluation without an optimizer runs the module itself).
    Attributes the wrapper lacks come from the engine (``model.global_steps``).
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.__dict__["engine"] = None  # not a registered child: the engine wraps the same module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        engine = self.__dict__["engine"]
        return (engine if engine is not None else self.module)(*args, **kwargs)

    def train(self, mode: bool = True) -> DeepSpeedModel:
        super().train(mode)
        if self.__dict__["engine"] is not None:
            self.__dict__["engine"].train(mode)
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            engine = self.__dict__.get("engine")
            if engine is None:
                raise
            return getattr(engine, name)


def check_installed() -> None:
    """Fail at construction, without importing DeepSpeed (slow), when it is not installed."""
    from trainer._imports import is_available, require

    if not is_available("deepspeed"):
        require("deepspeed", extra="deepspeed", feature="DeepSpeedStrategy")


def import_deepspeed(accelerator_type: str = "cpu") -> Any:
    """Import DeepSpeed (on the CPU accelerator when asked) and check its version.

    Raises:
        MissingDependencyError: DeepSpeed is not installed, or older than 0.19.4.
    """
    if accelerator_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read once, at DeepSpeed's import
    from trainer._imports import require
    from trainer.errors import MissingDependencyError

    deepspeed = require("deepspeed", extra="deepspeed", feature="DeepSpeedStrategy")
    version = tuple(int(p) for p in deepspeed.__version__.split("+")[0].split(".")[:3])
    if version < _MIN_VERSION:
        raise MissingDependencyError(
            f"DeepSpeedStrategy needs deepspeed>={'.'.join(map(str, _MIN_VERSION))} "
            f"(managed_gradient_accumulation=false); found {deepspeed.__version__}. Upgrade: "
            "pip install -U 'trainer[deepspeed]'"
        )
    return deepspeed


def is_partitioned(module: torch.nn.Module) -> bool:
    """Whether ZeRO-3 holds the module's parameters partitioned across ranks."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def initialize_engine(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    accelerator_type: str,
) -> tuple[Any, Any]:
    """``deepspeed.initialize`` on one model and its optimizer: (the engine, its optimizer).

    Raises:
        StrategyError: DeepSpeed refused the config (the message shows the config it got).
    """
    deepspeed = import_deepspeed(accelerator_type)
    try:
        engine, engine_optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=config, dist_init_required=False
        )
    except (ValueError, AssertionError, RuntimeError, TypeError) as err:
        raise StrategyError(
            f"deepspeed.initialize refused the config {json.dumps(config, default=str)}: "
            f"{err}. Fix the DeepSpeedStrategy arguments or its config."
        ) from err
    return engine, engine_optimizer


def set_clipping(engine: Any, max_norm: float) -> None:
    """Make the engine's coming ``step()`` clip the gradients' 2-norm to ``max_norm``."""
    # DeepSpeed 0.19 has no setter: the optimizer wrappers read clip_grad at step time and
    # stage 0 without a wrapper reads the config.
    engine._config.gradient_clipping = float(max_norm)  # noqa: SLF001
    if hasattr(engine.optimizer, "clip_grad"):
        engine.optimizer.clip_grad = float(max_norm)
