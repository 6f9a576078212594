"""bitsandbytes quantization: Accelerate's ``BnbQuantizationConfig`` and ``load_and_quantize_model``.

Owns the config and its checks, which ``torch.nn.Linear`` layers become ``bnb.nn.Linear8bitLt``
or ``bnb.nn.Linear4bit`` (all but ``skip_modules`` and ``keep_in_fp32_modules``; by default the
model's last child and tied weights stay as they are, as in Accelerate), the dtypes of what is
not quantized, and quantizing each layer onto its device.

Does not own reading weights (``trainer.big_modeling.loading.load_checkpoint_in_model``: our
checkpoints, safetensors files and indexes), placement and hooks (``dispatch_model``) nor the
kernels (bitsandbytes, imported on first use: ``pip install 'trainer[quantization]'``;
bitsandbytes 0.50 runs 8-bit and 4-bit layers on the CPU too).

Memory: a model built with ``init_empty_weights`` is loaded tensor by tensor, in the
checkpoint's dtype, then each layer is quantized in turn: the peak is the unquantized weights.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from trainer._imports import require
from trainer.big_modeling.device_map import (
    DeviceKey,
    DeviceMap,
    check_device_map,
    find_tied_parameters,
    lookup_device,
    main_device,
    normalize_device_map,
    torch_device,
)
from trainer.big_modeling.dispatch import dispatch_model, infer_auto_device_map
from trainer.big_modeling.loading import load_checkpoint_in_model
from trainer.errors import ConfigurationError, describe

__all__ = [
    "BnbQuantizationConfig",
    "get_keys_to_not_convert",
    "load_and_quantize_model",
    "replace_with_bnb_layers",
]

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass
class BnbQuantizationConfig:
    """How ``load_and_quantize_model`` quantizes: 8-bit (LLM.int8) or 4-bit (FP4 / NF4) layers.

    Args:
        load_in_8bit: replace linear layers with ``bnb.nn.Linear8bitLt``.
        llm_int8_threshold: the outlier threshold of 8-bit layers.
        load_in_4bit: replace linear layers with ``bnb.nn.Linear4bit``.
        bnb_4bit_quant_type: "fp4" or "nf4".
        bnb_4bit_use_double_quant: quantize the 4-bit quantization constants again.
        bnb_4bit_compute_dtype: dtype 4-bit layers compute in: "fp32", "fp16", "bf16" or a dtype.
        torch_dtype: dtype of the layers not quantized ("fp32", "fp16", "bf16" or a dtype);
            None is fp16 for 8-bit and the compute dtype for 4-bit.
        skip_modules: module names left as they are (in ``torch_dtype``); None is the model's
            last child and its tied weights. A name matches a module whose dotted path
            contains it as whole segments (``"lm_head"``, ``"layers.0.attn"``).
        keep_in_fp32_modules: module names left as they are, in float32.

    Raises:
        ConfigurationError: both or neither of ``load_in_8bit`` / ``load_in_4bit``, a flag that
            is not a bool, an unknown quant type or dtype, module lists that are not lists of str.

    Examples:
        >>> config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
        >>> config.bnb_4bit_compute_dtype, config.torch_dtype
        (torch.float16, torch.float16)
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: str | torch.dtype = "fp16"
    torch_dtype: str | torch.dtype | None = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        for flag in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigurationError(
                    f"BnbQuantizationConfig({flag}={describe(getattr(self, flag))}): expected True or False."
                )
        if self.load_in_8bit == self.load_in_4bit:
            raise ConfigurationError(
                f"BnbQuantizationConfig(load_in_8bit={self.load_in_8bit}, load_in_4bit="
                f"{self.load_in_4bit}): choose exactly one, e.g. load_in_8bit=True."
            )
        threshold = self.llm_int8_threshold
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            raise ConfigurationError(
                f"BnbQuantizationConfig(llm_int8_threshold={describe(threshold)}): expected a number, e.g. 6.0."
            )
        if self.load_in_4bit and threshold != 6.0:
            warnings.warn(
                "BnbQuantizationConfig: llm_int8_threshold applies to 8-bit layers only.",
                stacklevel=3,
            )
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ConfigurationError(
                f"BnbQuantizationConfig(bnb_4bit_quant_type={describe(self.bnb_4bit_quant_type)}): expected 'fp4' or 'nf4'."
            )
        self.bnb_4bit_compute_dtype = _dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype)
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype("torch_dtype", self.torch_dtype)
        for name in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise ConfigurationError(
                    f"BnbQuantizationConfig({name}={describe(value)}): expected a list of module "
                    "names, e.g. ['lm_head']."
                )

    @property
    def target_dtype(self) -> torch.dtype:
        """The storage dtype of quantized weights (4-bit values are packed in uint8)."""
        return torch.int8 if self.load_in_8bit else torch.uint8


def _dtype(argument: str, value: object) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value in _DTYPES:
        return _DTYPES[value]
    raise ConfigurationError(
        f"BnbQuantizationConfig({argument}={describe(value)}): expected 'fp32', 'fp16', 'bf16' or a torch.dtype."
    )


def matches(name: str, keys: list[str]) -> bool:
    """Whether module ``name`` contains one of ``keys`` as whole dotted segments."""
    return any(f".{key}." in f".{name}." for key in keys)


def get_keys_to_not_convert(model: torch.nn.Module) -> list[str]:
    """The modules Accelerate leaves unquantized by default: tied weights and the last child.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> get_keys_to_not_convert(net)
        ['1']
    """
    tied = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    if not tied and prefix is not None and not hasattr(model, prefix):
        return []  # a base model (no head) keeps nothing in full precision
    children = [name for name, _ in model.named_children()]
    modules = {name.rpartition(".")[0] or name for name in tied}
    return sorted(modules | ({children[-1]} if children else set()))


def replace_with_bnb_layers(
    model: torch.nn.Module, config: BnbQuantizationConfig, modules_to_not_convert: list[str]
) -> list[str]:
    """Swap each ``nn.Linear`` outside ``modules_to_not_convert`` for its bitsandbytes layer.

    The new layer takes the old one's weight (meta or not, not yet quantized) and bias; its
    parameters do not require grad. Returns the names of the swapped modules, in order.
    """
    bnb = require("bitsandbytes", extra="quantization", feature="load_and_quantize_model")
    replaced: list[str] = []
    for name, module in list(model.named_modules()):
        # Exactly nn.Linear: subclasses such as MultiheadAttention's out_proj are read by their
        # owner through .weight, which a bitsandbytes layer does not hold in float.
        if type(module) is not torch.nn.Linear or matches(name, modules_to_not_convert):
            continue
        has_bias, shape = module.bias is not None, (module.in_features, module.out_features)
        if config.load_in_8bit:
            layer = bnb.nn.Linear8bitLt(
                *shape, has_bias, has_fp16_weights=False, threshold=config.llm_int8_threshold, device="meta"
            )  # fmt: skip
        else:
            layer = bnb.nn.Linear4bit(
                *shape, has_bias, config.bnb_4bit_compute_dtype, device="meta",
                compress_statistics=config.bnb_4bit_use_double_quant, quant_type=config.bnb_4bit_quant_type,
            )  # fmt: skip
        layer.weight = _unquantized(bnb, layer, config, module.weight.data)
        if has_bias:
            layer.bias = torch.nn.Parameter(module.bias.data, requires_grad=False)
        owner, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attribute, layer)
        replaced.append(name)
    if not replaced:
        warnings.warn(
            f"load_and_quantize_model: {type(model).__name__} has no torch.nn.Linear to quantize "
            "outside skip_modules / keep_in_fp32_modules (Conv1D-based models have none).",
            stacklevel=3,
        )
    return replaced


def _unquantized(bnb: Any, layer: Any, config: BnbQuantizationConfig, data: torch.Tensor) -> Any:
    """A bitsandbytes weight holding ``data`` as is; moving it to a device quantizes it."""
    if config.load_in_8bit:
        return bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)
    return bnb.nn.Params4bit(
        data, requires_grad=False, compress_statistics=config.bnb_4bit_use_double_quant,
        quant_type=config.bnb_4bit_quant_type, quant_storage=layer.quant_storage, module=layer,
    )  # fmt: skip


def load_and_quantize_model(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: str | os.PathLike[str] | None = None,
    device_map: DeviceMap | str | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_state_dict: bool = False,
) -> torch.nn.Module:
    """Quantize ``model``'s linear layers with bitsandbytes, loading its weights first if empty.

    A model built under ``init_empty_weights`` is loaded from ``weights_location`` (a trainer
    checkpoint or ``save_model`` folder, a ``.safetensors`` file or index, a legacy file) tensor
    by tensor; a model with weights is quantized as it is. Layers that are not quantized take
    ``torch_dtype`` (float32 for ``keep_in_fp32_modules``); then each quantized layer moves to
    its device, which quantizes it, and ``dispatch_model`` places the rest.

    Args:
        model: the model, empty (meta) or with weights.
        bnb_quantization_config: what to quantize and how.
        weights_location: where the weights are; required for an empty model.
        device_map: ``{module: device}``, "auto" / "balanced" / "balanced_low_0" / "sequential"
            (sizes counted before quantization), or None: the current GPU, else the CPU.
        no_split_module_classes: for the string maps, classes kept on one device.
        max_memory: for the string maps, bytes per device.
        offload_folder: unused; disk offload is not supported for quantized models.
        offload_state_dict: accepted for Accelerate compatibility; loading is per tensor.

    Returns:
        ``model`` with bitsandbytes layers, on its devices (``is_loaded_in_8bit`` /
        ``is_loaded_in_4bit`` set, as peft expects).

    Raises:
        MissingDependencyError: bitsandbytes is not installed.
        ConfigurationError: an empty model without ``weights_location``; a device map that
            sends modules to "disk", or quantized layers to the CPU while the map runs on a GPU.
        CheckpointError: see ``load_checkpoint_in_model``.

    Examples:
        >>> with init_empty_weights():
        ...     net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
        >>> net = load_and_quantize_model(net, BnbQuantizationConfig(load_in_8bit=True),
        ...     weights_location="model.safetensors", device_map={"": "cpu"})
        >>> type(net[0]).__name__, net[0].weight.dtype, net[1].weight.dtype
        ('Linear8bitLt', torch.int8, torch.float16)
    """
    del offload_folder, offload_state_dict  # no disk offload; loading is per tensor anyway
    config = bnb_quantization_config
    skip = (
        list(config.skip_modules)
        if config.skip_modules is not None
        else get_keys_to_not_convert(model)
    )
    keep_fp32 = list(config.keep_in_fp32_modules or [])
    is_empty = any(p.device.type == "meta" for p in model.parameters())
    if is_empty and weights_location is None:
        raise ConfigurationError(
            "load_and_quantize_model: the model has no weights (built under init_empty_weights) "
            "and weights_location is None; pass the checkpoint folder or .safetensors file."
        )
    dtype = _dtype("torch_dtype", config.torch_dtype)
    quantized = replace_with_bnb_layers(model, config, skip + keep_fp32)
    device_map = _resolve_device_map(
        model, config, device_map, max_memory, no_split_module_classes, keep_fp32
    )
    check_device_map(model, device_map)
    _check_placement(device_map, quantized)
    if weights_location is not None and is_empty:
        on_cpu: DeviceMap = {f"{name}.weight": "cpu" for name in quantized}  # quantized below
        load_checkpoint_in_model(model, weights_location, {**device_map, **on_cpu})
    _cast_unquantized(model, quantized, dtype, keep_fp32)
    bnb = require("bitsandbytes", extra="quantization", feature="load_and_quantize_model")
    for name in quantized:  # one layer at a time: its weight is quantized as it moves
        layer = model.get_submodule(name)
        key = cast(DeviceKey, lookup_device(name, device_map))  # check_device_map: never None
        data = layer.weight.data.to("cpu", dtype)
        layer.weight = _unquantized(bnb, layer, config, data).to(torch_device(key))
    model.is_loaded_in_8bit = config.load_in_8bit  # type: ignore[assignment]  # peft reads these
    model.is_loaded_in_4bit = config.load_in_4bit  # type: ignore[assignment]  # peft reads these
    return dispatch_model(model, device_map)


def _resolve_device_map(
    model: torch.nn.Module,
    config: BnbQuantizationConfig,
    device_map: DeviceMap | str | None,
    max_memory: Mapping[DeviceKey, int | str] | None,
    no_split_module_classes: list[str] | None,
    keep_fp32: list[str],
) -> DeviceMap:
    if device_map is None:
        return {"": torch.cuda.current_device() if torch.cuda.is_available() else "cpu"}
    if isinstance(device_map, str):
        if device_map not in _AUTO_MAPS:
            raise ConfigurationError(
                f"load_and_quantize_model(device_map={device_map!r}): expected a dict or one of "
                f"{', '.join(map(repr, _AUTO_MAPS))}."
            )
        specials: dict[str, torch.dtype | str] = {
            name: torch.float32
            for name, _ in model.named_parameters()
            if matches(name.rpartition(".")[0], keep_fp32)
        }
        return infer_auto_device_map(
            model, max_memory, no_split_module_classes, config.torch_dtype, special_dtypes=specials
        )
    return normalize_device_map(device_map)


def _check_placement(device_map: DeviceMap, quantized: list[str]) -> None:
    """No disk offload; quantized layers run where they are placed, never streamed."""
    if "disk" in device_map.values():
        raise ConfigurationError(
            f"load_and_quantize_model: device_map {device_map} sends modules to 'disk'; "
            "quantized models are not offloaded to disk. Map them to a GPU or 'cpu' "
            "(bitsandbytes runs on the CPU), or give max_memory more room."
        )
    if main_device(device_map).type == "cpu":
        return
    streamed = [name for name in quantized if lookup_device(name, device_map) == "cpu"]
    if streamed:
        raise ConfigurationError(
            f"load_and_quantize_model: quantized layers {streamed[:5]} are mapped to 'cpu' while "
            "the model runs on a GPU (they would be streamed to it). Map them to a GPU, or put "
            "them in skip_modules to keep them unquantized on the CPU."
        )


def _cast_unquantized(
    model: torch.nn.Module, quantized: list[str], dtype: torch.dtype, keep_fp32: list[str]
) -> None:
    """``dtype`` for floating-point tensors outside the quantized weights, float32 where kept."""
    weights = {f"{name}.weight" for name in quantized}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in weights or not param.is_floating_point() or param.device.type == "meta":
            continue
        param.data = param.data.to(
            torch.float32 if matches(name.rpartition(".")[0], keep_fp32) else dtype
        )
