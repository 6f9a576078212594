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
import warnings
from typing import Any

import torch

from trainer.errors import StrategyError
from trainer.precision.precision import cast_floating
from trainer.strategies.deepspeed_lifetime import track_engine

__all__ = [
    "DeepSpeedModel",
    "check_installed",
    "engine_dtype",
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

    When the engine runs in bf16 or fp16 (its weights in that dtype, torch's autocast switched
    off inside its forward on a GPU), floating-point inputs are cast to that dtype first, as
    Lightning's DeepSpeed precision does with the batch; integer inputs (token ids) stay.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.__dict__["engine"] = None  # not a registered child: the engine wraps the same module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        engine = self.__dict__["engine"]
        if engine is None:
            return self.module(*args, **kwargs)
        if self.__dict__.get("_cast_for") is not engine:
            self.__dict__["_cast_for"] = engine
            self.__dict__["_cast_to"] = engine_dtype(engine)
        dtype = self.__dict__["_cast_to"]
        if dtype is not None:
            args, kwargs = cast_floating(args, dtype), cast_floating(kwargs, dtype)
        return engine(*args, **kwargs)

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


def engine_dtype(engine: Any) -> torch.dtype | None:
    """bf16 or fp16 when the engine's weights are in it (its bf16 / fp16 section); else None."""
    if engine.bfloat16_enabled():
        return torch.bfloat16
    if engine.fp16_enabled():
        return torch.float16
    return None


def check_installed() -> None:
    """Fail at construction, without importing DeepSpeed (slow), when it is not installed."""
    from trainer._imports import is_available, require

    if not is_available("deepspeed"):
        require("deepspeed", extra="deepspeed", feature="DeepSpeedStrategy")


def import_deepspeed(accelerator_type: str = "cpu") -> Any:
    """Import DeepSpeed (on the CPU accelerator when asked) and check its version.

    Raises:
        MissingDependencyError: DeepSpeed is not installed, or older than 0.19.4.
        StrategyError: the CPU was asked for, but DeepSpeed was imported earlier and chose a GPU.
    """
    if accelerator_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read once, at DeepSpeed's import
    from trainer._imports import require
    from trainer.errors import MissingDependencyError

    deepspeed = require("deepspeed", extra="deepspeed", feature="DeepSpeedStrategy")
    if accelerator_type == "cpu":
        chosen = deepspeed.accelerator.get_accelerator().device_name()
        if chosen != "cpu":
            raise StrategyError(
                f"DeepSpeedStrategy(accelerator='cpu'): DeepSpeed was imported before the strategy "
                f"set DS_ACCELERATOR=cpu and chose its {chosen!r} accelerator, which it keeps for "
                "the process. Set DS_ACCELERATOR=cpu before anything imports deepspeed, or train "
                f"on {chosen!r}."
            )
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

    The engine is recorded (`trainer.strategies.deepspeed_lifetime.track_engine`) so that it is
    destroyed before the process group it runs on ends.

    Raises:
        StrategyError: DeepSpeed refused the config (the message shows the config it got).
    """
    deepspeed = import_deepspeed(accelerator_type)
    if accelerator_type == "cpu":
        warn_if_comm_op_build_locked()
    try:
        engine, engine_optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=config, dist_init_required=False
        )
    except (ValueError, AssertionError, RuntimeError, TypeError) as err:
        raise StrategyError(
            f"deepspeed.initialize refused the config {json.dumps(config, default=str)}: "
            f"{err}. Fix the DeepSpeedStrategy arguments or its config."
        ) from err
    track_engine(engine)
    return engine, engine_optimizer


def warn_if_comm_op_build_locked() -> None:
    """Warn when DeepSpeed's CPU comm op build will wait on a lock file that is already there.

    On the CPU accelerator ``deepspeed.initialize`` compiles its shared-memory comm op on first
    use (torch's ``cpp_extension``, about a minute), holding ``<build dir>/lock``; a build that
    was interrupted (Ctrl-C, a kill, a timeout) leaves the file, and every later run then waits
    for it forever without a word. Whether another process is still building cannot be told
    from the file, so this names it rather than deleting it.
    """
    from torch.utils import cpp_extension

    try:  # private in torch; without it there is nothing to name
        build_dir = cpp_extension._get_build_directory("deepspeed_shm_comm", verbose=False)  # noqa: SLF001
    except (AttributeError, TypeError, OSError):
        return
    lock = os.path.join(build_dir, "lock")
    if os.path.exists(lock):
        warnings.warn(
            f"DeepSpeed's CPU comm op build waits until {lock} is gone: another process is "
            "building it, or an interrupted build left the file. If no build is running, delete "
            "it; the run then goes on.",
            stacklevel=3,
        )


def set_clipping(engine: Any, max_norm: float) -> None:
    """Make the engine's coming ``step()`` clip the gradients' 2-norm to ``max_norm``."""
    # DeepSpeed 0.19 has no setter: the optimizer wrappers read clip_grad at step time and
    # stage 0 without a wrapper reads the config.
    engine._config.gradient_clipping = float(max_norm)  # noqa: SLF001
    if hasattr(engine.optimizer, "clip_grad"):
        engine.optimizer.clip_grad = float(max_norm)
