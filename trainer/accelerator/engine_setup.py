"""From the Accelerator's engine arguments to the existing Strategy and Precision plugin.

Accelerate configures its engines with plugins and kwargs handlers; `setup_engine` translates
each once onto what already runs them, so there is no second engine path:

- an engine plugin (``DeepSpeedPlugin``, ``FullyShardedDataParallelPlugin``,
  ``MegatronLMPlugin``) chooses ``DeepSpeedStrategy`` / ``FSDPStrategy`` / ``MegatronStrategy``
  and ``engine_configs`` gives its arguments. A strategy that only the launcher chose goes the
  same way with an empty plugin, so the launch file, its environment variables and a plugin
  give one strategy;
- a ``ParallelismConfig`` goes to ``strategy_for_parallelism`` (with an FSDP plugin's options);
- the DDP and process-group kwargs handlers become arguments of the engines that take them and
  are ignored by engines without such an object, as in Accelerate (``kwargs_handlers``);
- the precision handlers configure the Precision plugin; ``TorchDynamoPlugin`` is
  ``torch.compile``'s options.

Nothing here runs an engine: the Strategy classes do. This module only chooses their arguments.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.accelerator.engine_configs import (
    EnginePlugin,
    model_parallel_fsdp_options,
    strategy_options,
)
from trainer.accelerator.handler_setup import (
    build_precision,
    collect_handlers,
    handler_strategy_options,
)
from trainer.accelerator.parallelism import ParallelismConfig, strategy_for_parallelism
from trainer.errors import ConfigurationError, describe
from trainer.precision import Precision
from trainer.runtime.configs import GradientAccumulationPlugin
from trainer.runtime.engine_plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchDynamoPlugin,
)
from trainer.runtime.kwargs_handlers import KwargsHandler
from trainer.strategies import STRATEGY_REGISTRY, Strategy, auto_strategy_name, resolve_strategy
from trainer.strategies.model_parallel import ModelParallelStrategy

__all__ = ["EngineSetup", "setup_engine"]

_PLUGIN_STRATEGY: dict[type, str] = {
    DeepSpeedPlugin: "deepspeed",
    FullyShardedDataParallelPlugin: "fsdp",
    MegatronLMPlugin: "megatron",
}
_STRATEGY_PLUGIN = {name: plugin for plugin, name in _PLUGIN_STRATEGY.items()}


@dataclass(frozen=True)
class EngineSetup:
    """What the Accelerator's engine arguments resolve to (the strategy is not set up yet)."""

    strategy: Strategy
    precision: Precision
    accumulation: GradientAccumulationPlugin
    dynamo_plugin: TorchDynamoPlugin | None
    handlers: dict[str, KwargsHandler | None]  # by Accelerate's attribute name


def setup_engine(
    strategy: str | Strategy | None,
    *,
    cpu: bool,
    mixed_precision: str | Precision | None,
    gradient_accumulation_steps: int = 1,
    gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
    deepspeed_plugin: DeepSpeedPlugin | None = None,
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
    megatron_lm_plugin: MegatronLMPlugin | None = None,
    dynamo_plugin: TorchDynamoPlugin | None = None,
    dynamo_backend: str | None = None,
    parallelism_config: ParallelismConfig | None = None,
    kwargs_handlers: list[Any] | None = None,
) -> EngineSetup:
    """Resolve ``Accelerator(...)``'s engine arguments into a Strategy and a Precision plugin.

    Raises:
        ConfigurationError: two engine plugins, a plugin together with ``strategy``, both
            accumulation arguments, an unknown or repeated kwargs handler, an option the chosen
            engine cannot honour, or an fp8 recipe without ``mixed_precision="fp8"`` (each
            message names the fix).
    """
    if gradient_accumulation_plugin is not None and gradient_accumulation_steps != 1:
        raise ConfigurationError(
            "Accelerator: pass either gradient_accumulation_steps or "
            "gradient_accumulation_plugin, not both (received steps="
            f"{gradient_accumulation_steps} and a plugin)."
        )
    accumulation = gradient_accumulation_plugin or GradientAccumulationPlugin(
        num_steps=gradient_accumulation_steps
    )
    handlers = collect_handlers(kwargs_handlers)
    plugin = _one_engine_choice(
        strategy, deepspeed_plugin, fsdp_plugin, megatron_lm_plugin, parallelism_config
    )
    if parallelism_config is not None:
        built = _parallelism_strategy(parallelism_config, plugin, cpu, handlers)
        steps = None
    else:
        built, steps = _build_strategy(strategy, plugin, cpu, handlers)
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ConfigurationError(
            "Accelerator: pass either dynamo_backend or dynamo_plugin, not both (received "
            f"dynamo_backend={dynamo_backend!r} and a TorchDynamoPlugin)."
        )
    dynamo = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
    return EngineSetup(
        strategy=built,
        precision=build_precision(mixed_precision, handlers),
        accumulation=_with_engine_steps(accumulation, steps),
        dynamo_plugin=dynamo if dynamo.is_enabled else None,
        handlers=handlers,
    )


def _one_engine_choice(
    strategy: str | Strategy | None,
    deepspeed_plugin: Any,
    fsdp_plugin: Any,
    megatron_lm_plugin: Any,
    parallelism_config: Any,
) -> EnginePlugin | None:
    """The engine plugin given, after checking that at most one argument chooses the engine."""
    plugins = [p for p in (deepspeed_plugin, fsdp_plugin, megatron_lm_plugin) if p is not None]
    for argument, given, plugin_type in (
        ("deepspeed_plugin", deepspeed_plugin, DeepSpeedPlugin),
        ("fsdp_plugin", fsdp_plugin, FullyShardedDataParallelPlugin),
        ("megatron_lm_plugin", megatron_lm_plugin, MegatronLMPlugin),
    ):
        if given is not None and not isinstance(given, plugin_type):
            raise ConfigurationError(
                f"Accelerator({argument}={describe(given)}): expected one {plugin_type.__name__} "
                "(several named DeepSpeed plugins in a dict are not supported)."
            )
    choices = [type(p).__name__ for p in plugins]
    if strategy not in (None, "auto"):
        choices.append(f"strategy={strategy!r}")
    if parallelism_config is not None:
        choices = [c for c in choices if c != "FullyShardedDataParallelPlugin"]
        choices.append("parallelism_config")  # it may come with an FSDP plugin's options
    if len(choices) > 1:
        raise ConfigurationError(
            f"Accelerator: {', '.join(choices)} each choose the engine. Pass one of them."
        )
    return plugins[0] if plugins else None


# ---- strategies ----------------------------------------------------------------------------
def _build_strategy(
    strategy: str | Strategy | None,
    plugin: EnginePlugin | None,
    cpu: bool,
    handlers: dict[str, KwargsHandler | None],
) -> tuple[Strategy, int | None]:
    """The strategy for a plugin, a name or the launcher, with the handlers' options."""
    handler_options = handler_strategy_options(handlers)
    if isinstance(strategy, Strategy):
        if any(handler_options.values()):
            names = [name for name, options in handler_options.items() if options]
            raise ConfigurationError(
                f"Accelerator(strategy={strategy!r}, kwargs_handlers=[{', '.join(names)}]): the "
                "strategy instance is already built. Pass these options to its constructor, or "
                "pass the strategy by name."
            )
        return strategy, None
    if plugin is not None:
        name = _PLUGIN_STRATEGY[type(plugin)]
    else:
        name = auto_strategy_name() if strategy in (None, "auto") else strategy  # type: ignore[assignment]  # a str here
    target = _strategy_target(name)
    if plugin is None and name in _STRATEGY_PLUGIN:  # launched: the launch file's options apply
        plugin = _STRATEGY_PLUGIN[name]()
    options, steps = strategy_options(plugin)
    for handler_name, handler_opts in handler_options.items():
        options.update(_accepted_options(target, name, handler_name, handler_opts))
    if cpu:
        parameters = inspect.signature(target).parameters
        options["accelerator" if "accelerator" in parameters else "device"] = "cpu"
    return resolve_strategy(name, **options), steps


def _strategy_target(name: Any) -> Callable[..., Strategy]:
    """The registered class (or factory) for ``name``; the registry's error for an unknown one."""
    target = STRATEGY_REGISTRY.get(name) if isinstance(name, str) else None
    if target is None:
        resolve_strategy(name)  # raises the ConfigurationError listing the valid names
    if isinstance(target, str):
        module_name, _, class_name = target.partition(":")
        target = getattr(importlib.import_module(module_name), class_name)
    return target  # type: ignore[return-value]  # resolve_strategy raised for None


def _accepted_options(
    target: Callable[..., Any], name: str, handler: str, options: dict[str, Any]
) -> dict[str, Any]:
    """``options`` for an engine that takes them; ``{}`` for one that has no use for any."""
    parameters = inspect.signature(target).parameters
    if not options or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return options
    missing = sorted(set(options) - set(parameters))
    if len(missing) == len(options):
        return {}  # e.g. DDP options with FSDP or DeepSpeed: that engine has no DDP wrapper
    if missing:
        raise ConfigurationError(
            f"{handler}: the {name!r} strategy uses some of these options but has no "
            f"{', '.join(missing)}. Remove {'it' if len(missing) == 1 else 'them'} from the handler."
        )
    return options


def _with_engine_steps(
    accumulation: GradientAccumulationPlugin, engine_steps: int | None
) -> GradientAccumulationPlugin:
    """The Accelerator's accumulation, with DeepSpeed's steps when only DeepSpeed states them."""
    if engine_steps is None or engine_steps == accumulation.num_steps:
        return accumulation
    if accumulation.num_steps != 1:
        raise ConfigurationError(
            f"Accelerator(gradient_accumulation_steps={accumulation.num_steps}) and the DeepSpeed "
            f"plugin/config's gradient_accumulation_steps={engine_steps} disagree. State it once."
        )
    return dataclasses.replace(accumulation, num_steps=int(engine_steps))


# ---- ParallelismConfig ---------------------------------------------------------------------
def _parallelism_strategy(
    config: Any,
    plugin: EnginePlugin | None,
    cpu: bool,
    handlers: dict[str, KwargsHandler | None],
) -> Strategy:
    """``strategy_for_parallelism`` with an FSDP plugin's and the handlers' options."""
    if not isinstance(config, ParallelismConfig):
        raise ConfigurationError(
            f"Accelerator(parallelism_config={describe(config)}): expected a "
            "trainer.ParallelismConfig."
        )
    options: dict[str, Any] = {}
    if isinstance(plugin, FullyShardedDataParallelPlugin):
        options = model_parallel_fsdp_options(plugin)
    for name, handler_options in handler_strategy_options(handlers).items():
        if handler_options and not config.is_sharded:  # strategy_for_parallelism takes none
            raise ConfigurationError(
                f"{name} with a ParallelismConfig that only replicates: that is DDP. Pass "
                "strategy='ddp' (or nothing under a launcher) with the handler instead."
            )
        options.update(
            _accepted_options(ModelParallelStrategy, "model_parallel", name, handler_options)
        )
    return strategy_for_parallelism(
        config, accelerator="cpu" if cpu else None, fsdp_options=options or None
    )
