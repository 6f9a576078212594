"""``trainer estimate-memory``: the memory a model needs, computed from its shapes alone.

TARGET is ``package.module:ClassOrFactory`` (called with no arguments under
``init_empty_weights(include_buffers=True)``: nothing is allocated and no weight is read), a
``.safetensors`` file, a ``*.index.json`` or a directory holding them (only headers are read).

For each dtype it prints one table: the exact parameter count, the largest layer (what an
offloaded layer needs on the execution device), and bytes for

- inference: parameters and buffers, floating-point ones in the dtype (integers keep theirs);
- training: + gradients of trainable parameters + optimizer states (AdamW: ``exp_avg`` and
  ``exp_avg_sq`` like the parameter, plus a 4-byte ``step`` per parameter tensor; SGD with
  momentum: one buffer; plain SGD: none);
- one process under ``--strategy`` (any registered strategy): single, DDP and XLA replicate
  everything; FSDP, ZeRO-3 and model_parallel (tensor parallel x FSDP) divide parameters,
  gradients and states by ``--num_processes``; ZeRO-2 divides gradients and states, ZeRO-1 the
  states only (buffers are never divided; padding is ignored). For megatron, ``--num_processes``
  is the model-parallel size (tensor x pipeline): data-parallel replicas each hold a full share.

These figures are exact for the tensors the model holds (model_parallel and megatron shares
assume every parameter is split evenly: the caption says so). Activations are not in them: they
depend on batch and sequence sizes. The table's caption gives the usual estimate for inference
(+20%), and says it is one.

This module owns the subcommand's options, the arithmetic (`estimate`) and the tables. It
does not own device maps or loading (``trainer.big_modeling``).

Examples:
    $ trainer estimate-memory mypkg.models:build_llm --dtypes bfloat16 --strategy fsdp --num_processes 8
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigurationError, describe

__all__ = [
    "MemoryEstimate",
    "Sharding",
    "TensorInfo",
    "add_parser",
    "estimate",
    "load_target",
    "run",
]

DTYPES = ("float32", "float16", "bfloat16", "float64")
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum")
# The ZeRO stage whose division each engine's memory matches (0: every process holds it all;
# 3: parameters, gradients and states divided); deepspeed's is --stage. Engine names are the
# registry's: a registered name missing here is refused by name (tests keep the table complete).
_STAGE_OF = {
    "single": 0, "ddp": 0, "ddp_find_unused_parameters_true": 0,
    "ddp_find_unused_parameters_false": 0, "xla": 0, "fsdp": 3, "model_parallel": 3, "megatron": 3,
}  # fmt: skip
_EVEN_SPLIT_ASSUMED = ("model_parallel", "megatron")  # tensor-parallel plans may replicate some
_STEP_BYTES = 4  # torch's Adam/AdamW keep `step` as a float32 scalar tensor per parameter
_STATES_PER_PARAMETER = {"adamw": 2, "adam": 2, "sgd": 0, "sgd-momentum": 1}
_ACTIVATION_ESTIMATE = 0.20  # inference activations, rule of thumb (EleutherAI), not measured


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the model: enough to size it in any dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    is_parameter: bool
    requires_grad: bool
    layer: str | None  # the unit (leaf or no-split module) it belongs to

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, dtype: torch.dtype) -> int:
        """Bytes once floating-point values are in ``dtype`` (integers are never cast)."""
        return self.numel * (
            dtype.itemsize if self.dtype.is_floating_point else self.dtype.itemsize
        )


@dataclass(frozen=True)
class Sharding:
    """How one process's share is computed: ``stage`` is the ZeRO stage (DDP 0, FSDP 3)."""

    strategy: str
    stage: int
    num_processes: int

    def share(self, nbytes: int, *, divided_from_stage: int) -> int:
        """This process's bytes: the whole, or ``ceil(nbytes / N)`` once the stage divides it."""
        if self.stage >= divided_from_stage:
            return math.ceil(nbytes / self.num_processes)
        return nbytes


@dataclass(frozen=True)
class MemoryEstimate:
    """The figures of one table (bytes unless named otherwise)."""

    dtype: torch.dtype
    parameters: int  # count of parameter elements
    largest_layer: str
    largest_layer_bytes: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    per_process: dict[str, int] | None = None

    @property
    def inference_bytes(self) -> int:
        return self.parameter_bytes + self.buffer_bytes

    @property
    def training_bytes(self) -> int:
        return self.inference_bytes + self.gradient_bytes + self.optimizer_bytes


def estimate(
    tensors: list[TensorInfo],
    dtype: torch.dtype,
    *,
    optimizer: str = "adamw",
    sharding: Sharding | None = None,
) -> MemoryEstimate:
    """The memory of ``tensors`` in ``dtype`` for inference, training and one sharded process.

    Examples:
        >>> w = TensorInfo("fc.weight", (1000, 1000), torch.float32, True, True, "fc")
        >>> e = estimate([w], torch.bfloat16, sharding=Sharding("fsdp", 3, 4))
        >>> e.parameter_bytes, e.gradient_bytes, e.optimizer_bytes, e.per_process["total"]
        (2000000, 2000000, 4000004, 2000001)
    """
    params = [t for t in tensors if t.is_parameter]
    trainable = [t for t in params if t.requires_grad and t.dtype.is_floating_point]
    gradient_bytes = sum(t.nbytes(dtype) for t in trainable)
    states = _STATES_PER_PARAMETER[optimizer] * gradient_bytes
    if optimizer in ("adam", "adamw"):
        states += _STEP_BYTES * len(trainable)
    layers: dict[str, int] = {}
    for tensor in tensors:
        if tensor.layer is not None:
            layers[tensor.layer] = layers.get(tensor.layer, 0) + tensor.nbytes(dtype)
    largest = max(layers.items(), key=lambda item: item[1], default=("", 0))
    result = MemoryEstimate(
        dtype=dtype,
        parameters=sum(t.numel for t in params),
        largest_layer=largest[0],
        largest_layer_bytes=largest[1],
        parameter_bytes=sum(t.nbytes(dtype) for t in params),
        buffer_bytes=sum(t.nbytes(dtype) for t in tensors if not t.is_parameter),
        gradient_bytes=gradient_bytes,
        optimizer_bytes=states,
    )
    if sharding is None:
        return result
    share = {
        "parameters": sharding.share(result.parameter_bytes, divided_from_stage=3),
        "buffers": result.buffer_bytes,
        "gradients": sharding.share(gradient_bytes, divided_from_stage=2),
        "optimizer states": sharding.share(states, divided_from_stage=1),
    }
    share["total"] = sum(share.values())
    return MemoryEstimate(**{**vars(result), "per_process": share})


def load_target(target: str, no_split: list[str] | None = None) -> list[TensorInfo]:
    """The tensors of TARGET: a model built on meta, or the headers of safetensors files.

    Raises:
        ConfigurationError: TARGET is neither an existing path nor ``module:attribute``, cannot
            be imported or called, or is not a module.
    """
    path = Path(target)
    if path.exists():
        return _file_tensors(path)
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigurationError(
            f"estimate-memory: TARGET {target!r} is not a file and not 'package.module:ClassOrFactory'. "
            "Give a model class or factory, a .safetensors file, a *.index.json or a directory holding them."
        )
    return _module_tensors(_build(module_name, attribute), no_split or [])


def _build(module_name: str, attribute: str) -> torch.nn.Module:
    """Import ``module_name`` (the current directory first, as ``python -m`` would) and build."""
    from trainer.big_modeling.api import init_empty_weights

    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigurationError(
            f"estimate-memory: cannot import {module_name!r} ({err}). Run from the directory that "
            "holds the package, or put it on PYTHONPATH."
        ) from err
    finally:
        if added:
            sys.path.remove(os.getcwd())
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigurationError(
                f"estimate-memory: {module_name!r} has no attribute {attribute!r}."
            )
        obj = getattr(obj, part)
    try:
        with init_empty_weights(include_buffers=True):
            model = obj()
    except Exception as err:  # the user's constructor: say which call failed and how to fix it
        raise ConfigurationError(
            f"estimate-memory: calling {module_name}:{attribute}() raised {type(err).__name__}: {err}. "
            "TARGET must build the model without arguments: point it at a small factory function."
        ) from err
    if not isinstance(model, torch.nn.Module):
        raise ConfigurationError(
            f"estimate-memory: {module_name}:{attribute}() returned {describe(model)}; expected a torch.nn.Module."
        )
    return model


def _module_tensors(model: torch.nn.Module, no_split: list[str]) -> list[TensorInfo]:
    """Parameters (a tied one once) and buffers, each with the layer unit that holds it."""
    no_split = no_split + list(getattr(model, "_no_split_modules", None) or [])
    units: list[str] = []

    def walk(module: torch.nn.Module, name: str) -> None:
        children = list(module.named_children())
        if not children or type(module).__name__ in no_split:
            units.append(name)
            return
        for child_name, child in children:
            walk(child, f"{name}.{child_name}" if name else child_name)

    walk(model, "")

    def layer_of(name: str) -> str | None:
        return next((u for u in units if not u or name.startswith(u + ".")), None)

    infos = [
        TensorInfo(n, tuple(p.shape), p.dtype, True, p.requires_grad, layer_of(n))
        for n, p in model.named_parameters()
    ]
    infos += [
        TensorInfo(n, tuple(b.shape), b.dtype, False, False, layer_of(n))
        for n, b in model.named_buffers()
    ]
    return infos


def _file_tensors(path: Path) -> list[TensorInfo]:
    """Headers of safetensors files: floating-point tensors count as trainable parameters."""
    from trainer.big_modeling.offload import read_safetensors_header, weight_files

    files, _ = weight_files(path)
    if any(file.suffix != ".safetensors" for file in files):
        raise ConfigurationError(
            f"estimate-memory: {path} is a pickle; only safetensors headers can be read without "
            "loading. Convert it, or give the model as package.module:ClassOrFactory."
        )
    infos = []
    for file in files:
        stored, _ = read_safetensors_header(file)
        for tensor in stored:
            floating = tensor.dtype.is_floating_point
            layer = tensor.name.rpartition(".")[0]
            infos.append(
                TensorInfo(tensor.name, tensor.shape, tensor.dtype, floating, floating, layer)
            )
    return infos


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``estimate-memory``.

    Examples:
        >>> root = argparse.ArgumentParser(prog="trainer")
        >>> parser = add_parser(root.add_subparsers(dest="command"))
        >>> root.parse_args(["estimate-memory", "m:Net", "--strategy", "fsdp"]).strategy
        'fsdp'
    """
    from trainer.strategies import STRATEGY_REGISTRY

    parser = subparsers.add_parser(
        "estimate-memory",
        help="memory for inference and training of a model, from its shapes alone",
        description=(
            "Print, per dtype, the exact parameter count, the largest layer and the memory for "
            "inference, for training (gradients and optimizer states) and per process under a "
            "sharding strategy. Nothing is allocated and no weight is read. Activations are not "
            "included (the caption gives an estimate)."
        ),
    )
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="package.module:ClassOrFactory, a .safetensors file, a *.index.json or a directory",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=DTYPES, default=["float32", "float16", "bfloat16"],
        metavar="DTYPE", help="one table per dtype (default: float32 float16 bfloat16)",
    )  # fmt: skip
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument(
        "--strategy", choices=list(STRATEGY_REGISTRY), default=None,
        help="also show one process's share under this registered strategy",
    )  # fmt: skip
    parser.add_argument(
        "--stage", type=int, choices=(0, 1, 2, 3), default=None,
        help="ZeRO stage for --strategy deepspeed (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--num_processes", type=int, default=1, metavar="N",
        help="processes sharing the model (default 1; megatron: tensor x pipeline parallel size)",
    )  # fmt: skip
    parser.add_argument(
        "--no_split_module_classes", nargs="+", default=[], metavar="CLASS",
        help="module classes counted as one layer, besides the model's _no_split_modules",
    )  # fmt: skip
    return parser


def _sharding(args: argparse.Namespace) -> Sharding | None:
    """The checked ``--strategy/--stage/--num_processes`` combination."""
    if args.stage is not None and args.strategy != "deepspeed":
        raise ConfigurationError(
            f"estimate-memory: --stage {args.stage} applies to --strategy deepspeed, got --strategy {args.strategy}. "
            "Drop --stage (DDP replicates, FSDP shards like ZeRO-3) or use --strategy deepspeed."
        )
    if args.num_processes < 1:
        raise ConfigurationError(
            f"estimate-memory: --num_processes {args.num_processes}; expected 1 or more."
        )
    if args.strategy is None:
        return None
    if args.strategy == "deepspeed":
        return Sharding(args.strategy, 2 if args.stage is None else args.stage, args.num_processes)
    if args.strategy not in _STAGE_OF:
        raise ConfigurationError(
            f"estimate-memory: --strategy {args.strategy} is registered, but how it divides memory "
            f"is not known here (known: deepspeed, {', '.join(_STAGE_OF)}). Use the one it works like."
        )
    if args.strategy == "single" and args.num_processes != 1:
        raise ConfigurationError(
            f"estimate-memory: --strategy single runs one process, got --num_processes "
            f"{args.num_processes}. Use --strategy ddp for replicas on several processes."
        )
    return Sharding(args.strategy, _STAGE_OF[args.strategy], args.num_processes)


def run(args: argparse.Namespace) -> int:
    """Print one table per dtype; return 0."""
    from rich.console import Console

    sharding = _sharding(args)
    tensors = load_target(args.target, args.no_split_module_classes)
    console = Console()
    for name in args.dtypes:
        figures = estimate(
            tensors, getattr(torch, name), optimizer=args.optimizer, sharding=sharding
        )
        console.print(_table(args.target, figures, args.optimizer, sharding))
    return 0


def _table(target: str, e: MemoryEstimate, optimizer: str, sharding: Sharding | None) -> Any:
    from rich.table import Table

    dtype = str(e.dtype).removeprefix("torch.")
    table = Table(title=f"{target} in {dtype}", title_justify="left", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{e.parameters:,}")
    table.add_row(f"largest layer ({e.largest_layer or 'the model'})", _size(e.largest_layer_bytes))
    table.add_section()
    table.add_row("inference: parameters + buffers", _size(e.inference_bytes))
    table.add_section()
    table.add_row("training: parameters + buffers", _size(e.inference_bytes))
    table.add_row("  + gradients", _size(e.gradient_bytes))
    table.add_row(f"  + {optimizer} states", _size(e.optimizer_bytes))
    table.add_row("  = total", _size(e.training_bytes))
    if sharding is not None and e.per_process is not None:
        table.add_section()
        zero = f" ZeRO-{sharding.stage}" if sharding.strategy == "deepspeed" else ""
        table.add_row(f"training, per process: {sharding.strategy}{zero}", "")
        table.add_row(f"  ({sharding.num_processes} processes)", "")
        for part, nbytes in e.per_process.items():
            table.add_row(f"  {'= ' if part == 'total' else ''}{part}", _size(nbytes))
    activations = math.ceil(e.inference_bytes * _ACTIVATION_ESTIMATE)
    table.caption = (
        "Exact for the tensors above. Activations are not included: for inference, estimate "
        f"+{_ACTIVATION_ESTIMATE:.0%} ({_size(activations, exact=False)}); for training they "
        "depend on the batch size."
    )
    if sharding is not None and sharding.strategy in _EVEN_SPLIT_ASSUMED:
        table.caption += (
            f" The {sharding.strategy} share assumes every parameter is split evenly "
            "(parameters the plan replicates cost more)."
        )
    table.caption_justify = "left"
    return table


def _size(nbytes: int, *, exact: bool = True) -> str:
    """``1.500 GiB (1,610,612,736 B)``: 4 significant digits, then the exact count."""
    value, unit = float(nbytes), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    if unit == "B":
        return f"{nbytes:,} B"
    digits = max(0, 3 - int(math.log10(value))) if value >= 1 else 3
    text = f"{value:.{digits}f} {unit}"
    return f"{text} ({nbytes:,} B)" if exact else text
