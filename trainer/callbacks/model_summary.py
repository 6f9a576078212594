"""ModelSummary: the table of layers and parameter counts printed when fit starts.

This module owns counting (`summarize`, `total_size_bytes`), the example-input trace
(`trace_example`: each layer's input and output sizes and FLOPs, as Lightning's summary shows
them when the module has ``example_input_array``) and the printed table. Counting reads the
module only; it neither moves nor materializes parameters, so a model on the meta device is
counted by ``numel``. The trace runs one forward in eval mode under ``no_grad`` and puts the
modes back. `rich` is imported when the table is printed (DESIGN §1).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer._imports import require
from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from rich.console import Console

    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = [
    "ExampleTrace",
    "LayerSummary",
    "ModelSummary",
    "format_count",
    "summarize",
    "total_size_bytes",
    "trace_example",
]

_RICH = {"extra": "all", "feature": "ModelSummary"}  # rich is a core dependency of every extra
_UNITS = ("", " K", " M", " B", " T")
UNKNOWN_SIZE = "?"  # a layer the example's forward did not reach, or a non-tensor value


@dataclass(frozen=True)
class LayerSummary:
    """One row of the summary: a submodule and its parameter counts.

    Args:
        name: dotted path from the summarized module, e.g. ``"encoder.0"``.
        type: class name of the submodule, e.g. ``"Linear"``.
        params: parameters in the submodule and its children (each shared tensor once).
        trainable_params: those of ``params`` with ``requires_grad=True``.
        training: whether the submodule is in train mode (Lightning's "Mode" column).

    Examples:
        >>> LayerSummary("0", "Linear", 55, 55).non_trainable_params
        0
    """

    name: str
    type: str
    params: int
    trainable_params: int
    training: bool = True

    @property
    def non_trainable_params(self) -> int:
        """Parameters that are frozen (``requires_grad=False``)."""
        return self.params - self.trainable_params


def summarize(module: torch.nn.Module, max_depth: int = 1) -> list[LayerSummary]:
    """List the submodules of ``module`` down to ``max_depth``, with their parameter counts.

    Depth 1 is the direct children; depth 2 adds their children, named ``"parent.child"``, in
    the order of ``named_modules``. -1 lists every depth; 0 lists nothing.

    Args:
        module: the model to describe; it is only read.
        max_depth: how many levels of children to list; -1 for all.

    Returns:
        One `LayerSummary` per submodule, parents before their children.

    Raises:
        ConfigurationError: ``max_depth`` is not an int >= -1.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.ReLU())
        >>> [(row.name, row.type, row.params) for row in summarize(model)]
        [('0', 'Linear', 55), ('1', 'ReLU', 0)]
    """
    _check_depth(max_depth, "summarize")
    rows = []
    for name, sub in _listed_modules(module, max_depth):
        params, trainable = _count(sub.parameters())
        rows.append(LayerSummary(name, type(sub).__name__, params, trainable, sub.training))
    return rows


def _listed_modules(module: torch.nn.Module, max_depth: int) -> list[tuple[str, torch.nn.Module]]:
    """The submodules a summary lists: every one down to ``max_depth`` (-1: all), the root not."""
    return [
        (name, sub)
        for name, sub in module.named_modules()
        if name and (max_depth == -1 or name.count(".") + 1 <= max_depth)
    ]


@dataclass
class ExampleTrace:
    """What one forward of the example input showed, per layer name.

    Args:
        in_sizes: each layer's input shape(s) at its first call (``[2, 4]``; a list per
            argument when it took several), `UNKNOWN_SIZE` where the value has no shape.
        out_sizes: the same for its output.
        flops: FLOPs counted in each layer and its children (``torch.utils.flop_counter``).
        total_flops: FLOPs of the whole forward.
    """

    in_sizes: dict[str, Any] = field(default_factory=dict)
    out_sizes: dict[str, Any] = field(default_factory=dict)
    flops: dict[str, int] = field(default_factory=dict)
    total_flops: int = 0


def trace_example(
    module: torch.nn.Module,
    example: Any,
    max_depth: int = 1,
    *,
    forward_context: contextlib.AbstractContextManager[Any] | None = None,
) -> ExampleTrace:
    """Run ``module(example)`` once, in eval mode under ``no_grad`` (modes put back after), and
    record the input / output sizes and FLOPs of the submodules `summarize` lists.

    A tuple or list example is passed as positional arguments, a dict as keywords, as Lightning
    passes ``example_input_array``; it must already be on the module's device.

    Args:
        module: the model.
        example: its example input.
        max_depth: as in `summarize`.
        forward_context: entered around the forward (the precision's autocast), or None.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        >>> trace = trace_example(model, torch.zeros(2, 4))
        >>> trace.in_sizes["0"], trace.out_sizes["0"], trace.flops["0"]
        ([2, 4], [2, 8], 128)
    """
    from torch.utils.flop_counter import FlopCounterMode

    _check_depth(max_depth, "trace_example")
    listed = _listed_modules(module, max_depth)  # no parameter counting: names only
    trace = ExampleTrace()
    handles = [
        sub.register_forward_hook(_size_recorder(name, trace), with_kwargs=True, always_call=False)
        for name, sub in listed
        if not isinstance(sub, torch.jit.ScriptModule)
    ]
    modes = {sub: sub.training for sub in module.modules()}
    counter = FlopCounterMode(display=False, depth=max_depth + 1 if max_depth != -1 else 1000)
    module.eval()
    try:
        with torch.no_grad(), forward_context or contextlib.nullcontext(), counter:
            if isinstance(example, list | tuple):
                module(*example)
            elif isinstance(example, dict):
                module(**example)
            else:
                module(example)
    finally:
        for handle in handles:
            handle.remove()
        for sub, training in modes.items():
            sub.training = training
    counts = counter.get_flop_counts()
    root = type(module).__name__
    trace.flops = {name: sum(counts.get(f"{root}.{name}", {}).values()) for name, _ in listed}
    trace.total_flops = counter.get_total_flops()
    return trace


def _size_recorder(name: str, trace: ExampleTrace) -> Any:
    def record(_module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if name in trace.in_sizes:  # the first call only (a module used twice)
            return
        inputs = (*args, *kwargs.values())
        trace.in_sizes[name] = _shape_of(inputs[0] if len(inputs) == 1 else inputs)
        trace.out_sizes[name] = _shape_of(output)

    return record


def _shape_of(value: Any) -> Any:
    if hasattr(value, "shape"):
        return list(value.shape)
    if isinstance(value, list | tuple):
        return [_shape_of(item) for item in value]
    return UNKNOWN_SIZE


def total_size_bytes(module: torch.nn.Module) -> int:
    """Bytes taken by the parameters and buffers of ``module``: the sum of numel * element size.

    Shared tensors count once; parameters on the meta device count as if they were allocated.

    Args:
        module: the model to measure.

    Returns:
        The size in bytes.

    Examples:
        >>> total_size_bytes(torch.nn.Linear(10, 5))  # 55 float32 values
        220
        >>> total_size_bytes(torch.nn.Linear(10, 5).to(torch.bfloat16))
        110
    """
    tensors = [*module.parameters(), *module.buffers()]
    return sum(_numel(t) * t.element_size() for t in tensors if _numel(t))


def format_count(number: int) -> str:
    """Write a count as Lightning's summary does: K, M, B, T by thousands, one decimal below 100.

    Args:
        number: a count, e.g. ``1234``.

    Returns:
        ``"123"``, ``"1.2 K"``, ``"34.5 M"``, ``"123 K"`` (no decimal from 100 on), ``"5,000 T"``.

    Examples:
        >>> format_count(55), format_count(1234), format_count(3_400_000), format_count(123_456)
        ('55', '1.2 K', '3.4 M', '123 K')
    """
    if abs(number) < 1000:
        return str(int(number))
    digits = math.floor(math.log10(abs(number))) + 1
    groups = min(math.ceil(digits / 3), len(_UNITS))
    value = number / 10 ** (3 * (groups - 1))
    if abs(value) >= 100:
        return f"{int(value):,d}{_UNITS[groups - 1]}"
    return f"{value:,.1f}{_UNITS[groups - 1]}"


class ModelSummary(Callback):
    """Print a table of the model's layers and parameter counts when fit starts (rank zero).

    Lightning's columns: one row per submodule down to ``max_depth`` with its index, name, type,
    parameters, mode (train / eval) and FLOPs, plus its input and output sizes when the module
    has ``example_input_array`` (`summarize` has each row's trainable count); an "Other
    params" row for parameters held by the module itself; then the totals, the estimated size
    of the parameters in MB, the submodules in train and in eval mode, and the total FLOPs.
    Sizes and FLOPs come from one forward of ``example_input_array`` (`trace_example`), on
    every process (a sharded model's forward needs them all); without it FLOPs are 0.

    Args:
        max_depth: levels of submodules in the table; -1 for all, 0 prints nothing.
        console: the `rich.console.Console` to print to; defaults to one on stdout.

    Raises:
        ConfigurationError: ``max_depth`` is not an int >= -1.

    Examples:
        >>> # Trainer(callbacks=[ModelSummary(max_depth=2)]).fit(module) prints, for
        >>> # Sequential(Linear(10, 5), ReLU(), Linear(5, 2)): rows of 55, 0 and 12 parameters,
        >>> # then "Total params: 67" and "Total estimated model params size (MB): 0.000".
    """

    def __init__(self, max_depth: int = 1, *, console: Console | None = None) -> None:
        _check_depth(max_depth, "ModelSummary")
        self.max_depth = max_depth
        self._console = console

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self.max_depth == 0:
            return
        trace = _trace_module(trainer, module, self.max_depth)
        if trainer.is_global_zero:
            self.print_summary(module, trace=trace)

    def print_summary(self, module: torch.nn.Module, *, trace: ExampleTrace | None = None) -> None:
        """Print the table and totals for ``module`` to this callback's console.

        Args:
            module: the model to describe.
            trace: what its example input's forward showed (`trace_example`); None: run it
                here when ``module`` has an ``example_input_array``.

        Examples:
            >>> ModelSummary().print_summary(torch.nn.Linear(10, 5))  # no rows; "Total params: 55"
        """
        if self._console is None:
            self._console = require("rich.console", **_RICH).Console()
        if trace is None:
            trace = _trace_module(None, module, self.max_depth)
        rows = summarize(module, self.max_depth)
        params, trainable = _count(module.parameters())
        headers = ["", "Name", "Type", "Params", "Mode", "FLOPs"]
        has_sizes = trace is not None and getattr(module, "example_input_array", None) is not None
        if has_sizes:
            headers += ["In sizes", "Out sizes"]
        table = require("rich.table", **_RICH).Table(header_style="bold magenta")
        for header in headers:
            is_text = header in ("Name", "Type", "Mode", "In sizes", "Out sizes")
            table.add_column(header, justify="left" if is_text else "right")
        flops = trace.flops if trace is not None else {}
        for index, row in enumerate(rows):
            cells = [str(index), row.name, row.type, format_count(row.params)]
            cells += ["train" if row.training else "eval", format_count(flops.get(row.name, 0))]
            if has_sizes and trace is not None:
                cells.append(str(trace.in_sizes.get(row.name, UNKNOWN_SIZE)))
                cells.append(str(trace.out_sizes.get(row.name, UNKNOWN_SIZE)))
            table.add_row(*cells)
        leftover = params - sum(row.params for row in rows)
        if rows and leftover > 0:  # Lightning's row for parameters no listed layer holds
            cells = [" ", "Other params", "n/a", format_count(leftover), "n/a", "n/a"]
            table.add_row(*cells, *(["n/a", "n/a"] if has_sizes else []))
        submodules = list(module.modules())[1:]
        in_train = sum(sub.training for sub in submodules)
        size_mb = sum(_numel(p) * p.element_size() for p in module.parameters()) / 1e6
        self._console.print(table)
        lines = (
            f"Trainable params: {format_count(trainable)}",
            f"Non-trainable params: {format_count(params - trainable)}",
            f"Total params: {format_count(params)}",
            f"Total estimated model params size (MB): {size_mb:,.3f}",
            f"Modules in train mode: {in_train}",
            f"Modules in eval mode: {len(submodules) - in_train}",
            f"Total FLOPs: {format_count(trace.total_flops if trace is not None else 0)}",
        )
        for line in lines:
            self._console.print(line, markup=False, highlight=False)


def _trace_module(trainer: Trainer | None, module: Any, max_depth: int) -> ExampleTrace | None:
    """`trace_example` of ``module.example_input_array`` (through the batch-transfer hooks and
    onto the module's device, under the precision's autocast), or None without one."""
    example = getattr(module, "example_input_array", None)
    if example is None:
        return None
    from trainer.data.transfer import send_to_device
    from trainer.trainer.data_hooks import batch_transfer

    parameter = next(iter(module.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    context = None
    if trainer is not None and getattr(trainer, "accelerator", None) is not None:
        transfer = batch_transfer(module, trainer.datamodule, device, 0)
        context = trainer.precision_plugin.autocast()
    else:
        transfer = None
    example = transfer(example) if transfer is not None else send_to_device(example, device)
    return trace_example(module, example, max_depth, forward_context=context)


def _numel(tensor: torch.Tensor) -> int:
    """Element count; a lazy module's parameter is not yet shaped, so it counts 0."""
    return 0 if torch.nn.parameter.is_lazy(tensor) else tensor.numel()


def _count(params: Iterable[torch.nn.Parameter]) -> tuple[int, int]:
    """(all, trainable) element counts over an iterable of parameters."""
    total = trainable = 0
    for param in params:
        n = _numel(param)
        total += n
        trainable += n if param.requires_grad else 0
    return total, trainable


def _check_depth(max_depth: object, where: str) -> None:
    if type(max_depth) is not int or max_depth < -1:
        raise ConfigurationError(
            f"{where}(max_depth=...) expected an int >= -1 (-1 lists every level, 0 "
            f"none), received {describe(max_depth)}. Pass e.g. max_depth=1."
        )


class RichModelSummary(ModelSummary):
    """Lightning's ``RichModelSummary``: `ModelSummary`, whose table is already drawn with rich."""
