"""ModelSummary: the table of layers and parameter counts printed when fit starts.

This module owns counting (`summarize`, `total_size_bytes`) and the printed table.
It reads the module only; it neither moves nor materializes parameters, so a model on the meta
device is counted by ``numel``. `rich` is imported when the table is printed (DESIGN §1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer._imports import require
from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from rich.console import Console

    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["LayerSummary", "ModelSummary", "format_count", "summarize", "total_size_bytes"]

_RICH = {"extra": "all", "feature": "ModelSummary"}  # rich is a core dependency of every extra
_UNITS = ("", " K", " M", " B", " T")


@dataclass(frozen=True)
class LayerSummary:
    """One row of the summary: a submodule and its parameter counts.

    Args:
        name: dotted path from the summarized module, e.g. ``"encoder.0"``.
        type: class name of the submodule, e.g. ``"Linear"``.
        params: parameters in the submodule and its children (each shared tensor once).
        trainable_params: those of ``params`` with ``requires_grad=True``.

    Examples:
        >>> LayerSummary("0", "Linear", 55, 55).non_trainable_params
        0
    """

    name: str
    type: str
    params: int
    trainable_params: int

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
    for name, sub in module.named_modules():
        depth = name.count(".") + 1
        if not name or (max_depth != -1 and depth > max_depth):
            continue
        params, trainable = _count(sub.parameters())
        rows.append(LayerSummary(name, type(sub).__name__, params, trainable))
    return rows


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
    """Write a parameter count with a unit, one decimal past the thousands.

    Args:
        number: a count, e.g. ``1234``.

    Returns:
        ``"123"``, ``"1.2 K"``, ``"3.4 M"``, ``"7.0 B"`` or ``"1.0 T"``.

    Examples:
        >>> format_count(55), format_count(1234), format_count(3_400_000)
        ('55', '1.2 K', '3.4 M')
    """
    if abs(number) < 1000:
        return str(number)
    value, unit = float(number), 0
    while abs(value) >= 999.95 and unit < len(_UNITS) - 1:  # 999_960 is "1.0 M", not "1000.0 K"
        value, unit = value / 1000, unit + 1
    return f"{value:.1f}{_UNITS[unit]}"


class ModelSummary(Callback):
    """Print a table of the model's layers and parameter counts when fit starts (rank zero).

    The table lists index, name, type, parameters, trainable and non-trainable parameters per
    submodule down to ``max_depth``, followed by the totals and the estimated size in MB.

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
        if trainer.is_global_zero and self.max_depth != 0:
            self.print_summary(module)

    def print_summary(self, module: torch.nn.Module) -> None:
        """Print the table and totals for ``module`` to this callback's console.

        Args:
            module: the model to describe.

        Examples:
            >>> ModelSummary().print_summary(torch.nn.Linear(10, 5))  # no rows; "Total params: 55"
        """
        if self._console is None:
            self._console = require("rich.console", **_RICH).Console()
        rows = summarize(module, self.max_depth)
        table = require("rich.table", **_RICH).Table(header_style="bold magenta")
        for header in ("", "Name", "Type", "Params", "Trainable", "Non-trainable"):
            table.add_column(header, justify="left" if header in ("Name", "Type") else "right")
        for index, row in enumerate(rows):
            counts = (row.params, row.trainable_params, row.non_trainable_params)
            table.add_row(str(index), row.name, row.type, *(format_count(n) for n in counts))
        params, trainable = _count(module.parameters())
        size_mb = total_size_bytes(module) / 1e6
        self._console.print(table)
        lines = (
            f"Trainable params: {format_count(trainable)}",
            f"Non-trainable params: {format_count(params - trainable)}",
            f"Total params: {format_count(params)}",
            f"Total estimated model params size (MB): {size_mb:.3f}",
        )
        for line in lines:
            self._console.print(line, markup=False, highlight=False)


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
