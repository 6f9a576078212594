"""What each kwargs handler configures: the strategy's DDP and process group, the precision
plugin (grad scaler, autocast, fp8 recipe) and ``Accelerator.profile()``.

`collect_handlers` checks the list given to ``Accelerator(kwargs_handlers=...)``;
`handler_strategy_options` gives the strategy arguments of ``DistributedDataParallelKwargs`` and
``InitProcessGroupKwargs`` (``engine_setup`` passes them to engines that take them);
`build_precision` applies ``GradScalerKwargs``, ``AutocastKwargs`` and the fp8 recipes;
`profile_session` runs ``ProfileKwargs``; `autocast_context` is ``accelerator.autocast(handler)``. The handler classes themselves live in
``trainer.runtime.kwargs_handlers``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainer._imports import require
from trainer.errors import ConfigurationError, describe
from trainer.precision import FP8Precision, MixedPrecision, Precision, resolve_precision
from trainer.runtime.kwargs_handlers import (
    AORecipeKwargs,
    AutocastKwargs,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    TERecipeKwargs,
)

__all__ = [
    "HANDLER_ATTRIBUTES",
    "autocast_context",
    "build_precision",
    "collect_handlers",
    "handler_strategy_options",
    "profile_session",
]

# Accelerate's Accelerator attribute for each handler class (``accelerator.ddp_handler``...).
HANDLER_ATTRIBUTES: dict[type[KwargsHandler], str] = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
    FP8RecipeKwargs: "fp8_recipe_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
}


def collect_handlers(kwargs_handlers: list[Any] | None) -> dict[str, KwargsHandler | None]:
    """Each handler under Accelerate's attribute name (None where not given).

    Raises:
        ConfigurationError: an object that is not a known handler, or one class twice.
    """
    found: dict[str, KwargsHandler | None] = dict.fromkeys(HANDLER_ATTRIBUTES.values())
    for handler in kwargs_handlers or []:
        name = HANDLER_ATTRIBUTES.get(type(handler))
        if name is None:
            known = ", ".join(cls.__name__ for cls in HANDLER_ATTRIBUTES)
            raise ConfigurationError(
                f"Accelerator(kwargs_handlers=[..., {describe(handler)}]): not a kwargs handler "
                f"trainer knows. Expected instances of {known}."
            )
        if found[name] is not None:
            raise ConfigurationError(
                f"Accelerator(kwargs_handlers=...): two {type(handler).__name__} were given. "
                "Pass one of each kind."
            )
        found[name] = handler
    return found


def handler_strategy_options(
    handlers: dict[str, KwargsHandler | None],
) -> dict[str, dict[str, Any]]:
    """Strategy arguments from the DDP and process-group handlers (only what they change)."""
    options: dict[str, dict[str, Any]] = {}
    ddp = handlers["ddp_handler"]
    if isinstance(ddp, DistributedDataParallelKwargs):
        ddp_options = ddp.to_kwargs()
        hook, state = _comm_hook(ddp)
        if hook is not None:
            ddp_options.update(ddp_comm_hook=hook, ddp_comm_state=state)
        options["DistributedDataParallelKwargs"] = ddp_options
    init = handlers["init_handler"]
    if isinstance(init, InitProcessGroupKwargs):
        changed = init.to_kwargs()
        renamed = {"backend": "process_group_backend", "timeout": "timeout"}
        options["InitProcessGroupKwargs"] = {
            renamed[k]: v for k, v in changed.items() if k in renamed
        }
    return options


def _comm_hook(handler: DistributedDataParallelKwargs) -> tuple[Callable[..., Any] | None, Any]:
    """The DDP communication hook (and its state) the handler names, as Accelerate builds it."""
    if handler.comm_hook.value == "no":
        return None, None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks = {
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "power_sgd": powerSGD_hook.powerSGD_hook,
        "batched_power_sgd": powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {
        "fp16": default_hooks.fp16_compress_wrapper,
        "bf16": default_hooks.bf16_compress_wrapper,
    }
    hook = hooks[handler.comm_hook.value]
    if handler.comm_wrapper.value in wrappers:
        hook = wrappers[handler.comm_wrapper.value](hook)
    if handler.comm_hook.value in ("power_sgd", "batched_power_sgd"):
        return hook, powerSGD_hook.PowerSGDState(None, **handler.comm_state_option)
    return hook, None


def build_precision(
    mixed_precision: str | Precision | None, handlers: dict[str, KwargsHandler | None]
) -> Precision:
    """The precision plugin, with the scaler, autocast and fp8 recipe handlers applied."""
    if mixed_precision is None:
        mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    keys = ("fp8_recipe_handler", "ao_recipe_handler", "te_recipe_handler")
    recipes = [h for k in keys if isinstance(h := handlers[k], AORecipeKwargs | TERecipeKwargs)]
    if len(recipes) > 1:
        raise ConfigurationError(
            f"Accelerator(kwargs_handlers=...): {[type(r).__name__ for r in recipes]} are all fp8 "
            "recipes. Pass one."
        )
    if recipes and (isinstance(mixed_precision, Precision) or str(mixed_precision) != "fp8"):
        raise ConfigurationError(
            f"Accelerator(mixed_precision={describe(mixed_precision)}, kwargs_handlers=["
            f"{type(recipes[0]).__name__}(...)]): an fp8 recipe needs mixed_precision='fp8' "
            "(a ready FP8Precision takes its recipe in its own constructor)."
        )
    precision = (
        _fp8_precision(recipes[0])
        if recipes
        else resolve_precision(mixed_precision, argument="mixed_precision")
    )
    scaler, autocast = handlers["scaler_handler"], handlers["autocast_handler"]
    if isinstance(scaler, GradScalerKwargs) and isinstance(precision, MixedPrecision):
        precision.scaler_kwargs = scaler.to_kwargs()
    if isinstance(autocast, AutocastKwargs) and isinstance(
        precision, MixedPrecision | FP8Precision
    ):
        precision.autocast_kwargs = autocast.to_kwargs()
    return precision


def _fp8_precision(recipe: AORecipeKwargs | TERecipeKwargs) -> FP8Precision:
    """The fp8 plugin for a torchao or TransformerEngine recipe handler."""
    if isinstance(recipe, AORecipeKwargs):
        config = recipe.config
        if config is None:  # Accelerate's default: pad dims, fp8 all-gather under FSDP2
            config = {
                "pad_inner_dim": True if recipe.pad_inner_dim is None else recipe.pad_inner_dim,
                "enable_fsdp_float8_all_gather": recipe.enable_fsdp_float8_all_gather is not False,
            }
        return FP8Precision(
            backend="torchao", recipe=config, module_filter_fn=recipe.module_filter_func
        )
    kwargs = recipe.to_kwargs()
    for name in ("backend", "opt_level", "use_autocast_during_eval", "use_mxfp8_block_scaling"):
        kwargs.pop(name, None)
    te_recipe = require(
        "transformer_engine.common.recipe", extra="fp8-te", feature="TERecipeKwargs"
    )
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    if recipe.use_mxfp8_block_scaling:
        refused = sorted({"amax_compute_algo", "amax_history_len"} & set(kwargs))
        if refused:
            raise ConfigurationError(
                f"{type(recipe).__name__}(use_mxfp8_block_scaling=True): MXFP8 block scaling has "
                f"no {', '.join(refused)}. Remove them."
            )
        return FP8Precision(
            backend="transformer_engine", recipe=te_recipe.MXFP8BlockScaling(**kwargs)
        )
    return FP8Precision(backend="transformer_engine", recipe=te_recipe.DelayedScaling(**kwargs))


@contextlib.contextmanager
def profile_session(
    handler: ProfileKwargs, process_index: int, barrier: Callable[[], None]
) -> Iterator[torch.profiler.profile]:
    """Profile the block; with ``output_trace_dir`` write ``profile_<process_index>.json`` there.

    Every process writes its own Chrome trace, then waits for the others (``barrier``).
    """
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    profiler.export_chrome_trace(
        os.path.join(handler.output_trace_dir, f"profile_{process_index}.json")
    )
    barrier()


def autocast_context(
    precision: Precision, handler: AutocastKwargs | None
) -> contextlib.AbstractContextManager[Any]:
    """The precision's autocast, or with ``handler`` (Accelerate's ``autocast(autocast_handler)``)
    a ``torch.autocast`` of the mixed precision's dtype with the handler's ``enabled`` and
    ``cache_enabled``. True precisions have no autocast either way (Accelerate: none without
    native AMP); fp8 keeps its own region."""
    if handler is None or type(precision) is not MixedPrecision:
        return precision.autocast()
    options: dict[str, Any] = {"enabled": handler.enabled}
    if handler.cache_enabled is not None:
        options["cache_enabled"] = handler.cache_enabled
    return torch.autocast(precision.device_type, dtype=precision.compute_dtype, **options)
