"""``"fp8"``: float8 matmuls for training, through torchao or TransformerEngine.

This module owns the choice of fp8 backend, the conversion of the module (torchao swaps
``nn.Linear`` layers for ``Float8Linear``; TransformerEngine layers are built by the user), the
region the forward pass runs in (bf16 autocast, plus ``te.fp8_autocast`` for TransformerEngine)
and the check that the device can run fp8 at all. It does not own sharding or communication
(the strategies do), and it imports neither library until that backend is chosen.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from trainer._imports import is_available, require
from trainer.errors import ConfigurationError, MissingDependencyError, describe
from trainer.precision.precision import Precision

__all__ = ["FP8_BACKENDS", "FP8_MIN_CAPABILITY", "TORCHAO_RECIPES", "FP8Precision"]

FP8_BACKENDS = ("auto", "torchao", "transformer_engine")
TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
FP8_MIN_CAPABILITY = (8, 9)  # Ada (L4, L40), Hopper (H100, H200), Blackwell: fp8 tensor cores
_DIM_MULTIPLE = 16  # torch._scaled_mm needs both matrix dims divisible by 16

ModuleFilter = Callable[[torch.nn.Module, str], bool]


class FP8Precision(Precision):
    """``"fp8"``: the big matmuls in float8, everything else in bf16 under autocast.

    Parameters stay in float32 (the optimizer's master copy); the forward pass runs under
    ``torch.autocast(dtype=torch.bfloat16)`` and the fp8 backend casts the inputs of its layers
    to float8 with dynamic (torchao) or delayed (TransformerEngine) scaling.

    Args:
        backend: "torchao" swaps each eligible ``nn.Linear`` for torchao's ``Float8Linear``
            (``convert_to_float8_training``); "transformer_engine" runs the forward pass under
            ``te.fp8_autocast`` over the TransformerEngine layers the module is built from
            (``te.Linear``, ``te.LayerNormMLP``, ``te.TransformerLayer``...); "auto" takes
            torchao when it is installed, else TransformerEngine.
        recipe: torchao: a recipe name ("tensorwise", the default; "rowwise";
            "rowwise_with_gw_hp"), a ``torchao.float8.Float8LinearConfig`` or a dict of its
            arguments. TransformerEngine: a ``transformer_engine.common.recipe`` object
            (default ``DelayedScaling()``).
        module_filter_fn: torchao only: ``fn(layer, fqn) -> bool``, False keeps a layer in high
            precision. Layers whose dims are not multiples of 16 are always kept.
        autocast_kwargs: extra ``torch.autocast`` arguments (``enabled``, ``cache_enabled``).

    Attributes:
        converted_layers: after `convert_module`, the names of the layers now in fp8.
        skipped_layers: the ``nn.Linear`` layers left in high precision, name -> why.

    Raises:
        ConfigurationError: for an unknown backend or a recipe the backend does not take; from
            `setup` on a device without fp8 tensor cores (CPU, compute capability < 8.9).
        MissingDependencyError: when the chosen backend (or, for "auto", either) is missing.

    Examples:
        >>> precision = FP8Precision(backend="torchao", recipe="tensorwise")
        >>> model = precision.convert_module(torch.nn.Sequential(
        ...     torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
        >>> precision.converted_layers, precision.skipped_layers
        (['0'], {'2': 'out_features=10 is not a multiple of 16 (float8 matmuls need 16)'})
        >>> Trainer(precision=precision)  # on an H100; on a CPU this raises ConfigurationError
    """

    name = "fp8"
    mixed_precision = "fp8"
    compute_dtype = torch.bfloat16  # the dtype of what is not fp8, under autocast

    def __init__(
        self,
        backend: str = "auto",
        recipe: Any = None,
        *,
        module_filter_fn: ModuleFilter | None = None,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.backend = _resolve_backend(backend)
        self.autocast_kwargs = dict(autocast_kwargs or {})
        if module_filter_fn is not None and self.backend != "torchao":
            raise ConfigurationError(
                "FP8Precision(module_filter_fn=...): only the torchao backend converts layers; "
                f"with backend={self.backend!r} choose layers by building them from "
                "TransformerEngine modules. Drop module_filter_fn or use backend='torchao'."
            )
        self._engine: _TorchaoEngine | _TransformerEngine = (
            _TorchaoEngine(recipe, module_filter_fn)
            if self.backend == "torchao"
            else _TransformerEngine(recipe)
        )
        self.device_type = "cuda"  # until setup(): fp8 exists only there
        self.converted_layers: list[str] = []
        self.skipped_layers: dict[str, str] = {}

    @property
    def recipe(self) -> Any:
        """The resolved recipe: a ``Float8LinearConfig`` or a TransformerEngine recipe."""
        return self._engine.recipe

    def setup(self, device: torch.device) -> None:
        """Check that ``device`` has fp8 tensor cores; training cannot start otherwise.

        Raises:
            ConfigurationError: on a CPU (or any non-CUDA device) or a GPU older than
                compute capability 8.9, naming the device and the fix.
        """
        self.device_type = device.type
        missing = _missing_fp8_hardware(device)
        if missing is not None:
            raise ConfigurationError(
                f"precision='fp8' (backend={self.backend!r}) needs an NVIDIA GPU with compute "
                f"capability {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or newer (L4, L40, "
                f"H100, H200, B200) for its float8 matmuls, but {missing}. Run on such a GPU, or "
                "choose precision='bf16-mixed'."
            )

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Make the module's layers fp8 layers (torchao) or check it has some (TransformerEngine).

        Works on any device, so the conversion can be inspected on a CPU; records
        `converted_layers` and `skipped_layers`.

        Raises:
            ConfigurationError: for TransformerEngine, when the module has no TransformerEngine
                layer (fp8_autocast would change nothing).
        """
        if getattr(module, "routes_steps_to_module", False):  # the Trainer's StepRouter
            # Convert the user's module inside it: layer names (and the fqn a module_filter_fn
            # sees) are then relative to the module the user wrote, as under Accelerate.
            module.module, converted, skipped = self._engine.convert(module.module)
        else:
            module, converted, skipped = self._engine.convert(module)
        self.converted_layers, self.skipped_layers = converted, skipped
        return module

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around the forward pass, with the backend's fp8 region inside."""
        return self._region()

    @contextlib.contextmanager
    def _region(self) -> Iterator[None]:
        with torch.autocast(self.device_type, dtype=self.compute_dtype, **self.autocast_kwargs):
            with self._engine.fp8_region():
                yield

    def __repr__(self) -> str:
        return f"FP8Precision(backend={self.backend!r}, recipe={self._engine.recipe_name!r})"


class _TorchaoEngine:
    """torchao float8 training: ``convert_to_float8_training`` swaps ``nn.Linear`` layers."""

    def __init__(self, recipe: Any, module_filter_fn: ModuleFilter | None) -> None:
        if isinstance(recipe, str) and recipe not in TORCHAO_RECIPES:
            raise ConfigurationError(
                f"FP8Precision(recipe={describe(recipe)}): torchao's recipes are "
                f"{', '.join(map(repr, TORCHAO_RECIPES))}; or pass a "
                "torchao.float8.Float8LinearConfig."
            )
        self.float8 = _import_torchao_float8()
        if recipe is None or isinstance(recipe, str):
            self.recipe_name = recipe or "tensorwise"
            self.recipe = self.float8.Float8LinearConfig.from_recipe_name(self.recipe_name)
        elif isinstance(recipe, self.float8.Float8LinearConfig):
            self.recipe_name = "custom"
            self.recipe = recipe
        elif isinstance(recipe, dict):  # Float8LinearConfig's arguments (AORecipeKwargs)
            self.recipe_name = "custom"
            try:
                self.recipe = self.float8.Float8LinearConfig(**recipe)
            except TypeError as err:
                raise ConfigurationError(
                    f"FP8Precision(recipe={describe(recipe)}): not Float8LinearConfig's "
                    f"arguments ({err})."
                ) from err
        else:
            raise ConfigurationError(
                f"FP8Precision(backend='torchao', recipe={describe(recipe)}): expected a recipe "
                f"name ({', '.join(map(repr, TORCHAO_RECIPES))}) or a "
                "torchao.float8.Float8LinearConfig. A TransformerEngine recipe needs "
                "backend='transformer_engine'."
            )
        self.module_filter_fn = module_filter_fn
        self.float8_linear = require(
            "torchao.float8.float8_linear", extra="fp8", feature="precision='fp8' (torchao)"
        ).Float8Linear

    def convert(self, module: torch.nn.Module) -> tuple[torch.nn.Module, list[str], dict[str, str]]:
        skipped: dict[str, str] = {}

        def keep_filter(layer: torch.nn.Module, fqn: str) -> bool:
            if isinstance(layer, self.float8_linear):
                return False  # converted by an earlier call: already fp8
            reason = self._skip_reason(layer, fqn)
            if reason is not None:
                skipped[fqn] = reason
            return reason is None

        module = self.float8.convert_to_float8_training(
            module, config=self.recipe, module_filter_fn=keep_filter
        )
        converted = [
            fqn for fqn, layer in module.named_modules() if isinstance(layer, self.float8_linear)
        ]
        return module, converted, skipped

    def _skip_reason(self, layer: torch.nn.Module, fqn: str) -> str | None:
        """Why ``layer`` stays in high precision, or None to convert it."""
        if self.module_filter_fn is not None and not self.module_filter_fn(layer, fqn):
            return "module_filter_fn returned False"
        for dim in ("in_features", "out_features"):
            size = getattr(layer, dim)
            if size % _DIM_MULTIPLE:
                return f"{dim}={size} is not a multiple of 16 (float8 matmuls need 16)"
        return None

    def fp8_region(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # Float8Linear casts on its own


class _TransformerEngine:
    """TransformerEngine: ``te.fp8_autocast`` over the user's TransformerEngine layers."""

    def __init__(self, recipe: Any) -> None:
        self.te = require(
            "transformer_engine.pytorch",
            extra="fp8-te",
            feature="precision='fp8' (TransformerEngine)",
        )
        recipes = require("transformer_engine.common.recipe", extra="fp8-te")
        if recipe is None:
            recipe = recipes.DelayedScaling()
        elif not isinstance(recipe, recipes.Recipe):
            raise ConfigurationError(
                f"FP8Precision(backend='transformer_engine', recipe={describe(recipe)}): "
                "expected a transformer_engine.common.recipe object, e.g. DelayedScaling() or "
                "Float8CurrentScaling(). Recipe names are torchao's: use backend='torchao'."
            )
        self.recipe = recipe
        self.recipe_name = type(recipe).__name__

    def convert(self, module: torch.nn.Module) -> tuple[torch.nn.Module, list[str], dict[str, str]]:
        converted = [fqn for fqn, layer in module.named_modules() if _is_te_layer(layer)]
        if not converted:
            raise ConfigurationError(
                f"FP8Precision(backend='transformer_engine'): {type(module).__name__} has no "
                "TransformerEngine layer, so fp8_autocast would change nothing. Build it from "
                "transformer_engine.pytorch modules (te.Linear, te.LayerNormMLP, "
                "te.TransformerLayer), or use backend='torchao', which converts nn.Linear itself."
            )
        skipped = {
            fqn: "a torch.nn.Linear, not a TransformerEngine layer"
            for fqn, layer in module.named_modules()
            if type(layer) is torch.nn.Linear
        }
        return module, converted, skipped

    def fp8_region(self) -> contextlib.AbstractContextManager[Any]:
        fp8_autocast = getattr(self.te, "fp8_autocast", None)
        if fp8_autocast is None:  # TransformerEngine releases that renamed it to `autocast`
            return self.te.autocast(enabled=True, recipe=self.recipe)
        return fp8_autocast(enabled=True, fp8_recipe=self.recipe)


def _resolve_backend(backend: str) -> str:
    """The backend to use: the one asked for, or for "auto" the first installed one."""
    if backend not in FP8_BACKENDS:
        raise ConfigurationError(
            f"FP8Precision(backend={describe(backend)}): expected one of "
            f"{', '.join(map(repr, FP8_BACKENDS))}."
        )
    if backend != "auto":
        return backend
    if is_available("torchao"):
        return "torchao"
    if is_available("transformer_engine"):
        return "transformer_engine"
    raise MissingDependencyError(
        "precision='fp8' needs torchao or TransformerEngine, and neither is installed. Install "
        "torchao with: pip install 'trainer[fp8]' (or TransformerEngine with: "
        "pip install 'trainer[fp8-te]')."
    )


def _import_torchao_float8() -> ModuleType:
    """Import torchao.float8, muting import-time noise the user cannot act on.

    torchao logs a warning for each CUDA kernel library it cannot load on a CPU build of torch,
    and torch logs a deprecation about how torchao registers an enum; neither affects fp8
    training on a GPU or the conversion on a CPU.
    """
    noisy = [logging.getLogger("torch.utils._pytree")]
    if torch.version.cuda is None:
        noisy.append(logging.getLogger("torchao"))
    levels = [logger.level for logger in noisy]
    for logger in noisy:
        logger.setLevel(logging.ERROR)
    try:
        return require("torchao.float8", extra="fp8", feature="precision='fp8' (torchao)")
    finally:
        for logger, level in zip(noisy, levels):
            logger.setLevel(level)


def _is_te_layer(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` is a TransformerEngine module (by its class's home, without importing)."""
    return type(layer).__module__.startswith("transformer_engine.")


def _missing_fp8_hardware(device: torch.device) -> str | None:
    """What ``device`` lacks for fp8 matmuls, in words, or None when it has them."""
    if device.type != "cuda":
        return f"this process runs on {device.type!r}"
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return f"{device} is a {name} with compute capability {capability[0]}.{capability[1]}"
    return None
