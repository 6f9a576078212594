"""The results table ``validate(verbose=True)`` / ``test(verbose=True)`` print, as Lightning prints it.

One row per metric (sorted by name, the ``/dataloader_idx_N`` suffix removed), one column per
dataloader (``DataLoader 0``, ...), the first column headed ``Validate metric`` or
``Test metric``; columns that do not fit the terminal continue in another table. Drawn with
rich when it is installed, else as plain text with rules, exactly as Lightning 2.6 does. The
Trainer calls `print_results` on global rank zero only; this module decides nothing else.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainer._imports import is_available
from trainer.trainer.metrics import to_float

__all__ = ["eval_results", "print_results"]


def eval_results(
    results: Sequence[Mapping[str, Any]], stage: str, verbose: bool
) -> list[dict[str, float]]:
    """``validate()`` / ``test()``'s return value from one epoch's logged values (floats), which
    `print_results` prints when ``verbose``."""
    floats = [{key: to_float(value) for key, value in result.items()} for result in results]
    if verbose:
        print_results(floats, stage)
    return floats


def print_results(results: Sequence[Mapping[str, Any]], stage: str) -> None:
    """Print ``results`` (one dict of metric -> value per dataloader) as ``stage``'s table.

    Args:
        results: what ``validate()`` / ``test()`` return.
        stage: ``"validate"`` or ``"test"``: the first column is headed ``"Validate metric"``.

    Examples:
        >>> print_results([{"val_loss": 0.25}], "validate")  # a rich table:
        ┏━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
        ┃      Validate metric      ┃       DataLoader 0        ┃
        ┡━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
        │         val_loss          │           0.25            │
        └───────────────────────────┴───────────────────────────┘
    """
    results = [{key.split("/dataloader_idx_")[0]: v for key, v in r.items()} for r in results]
    names = sorted({key for result in results for key in result})
    if not names:
        return
    headers = [f"DataLoader {i}" for i in range(len(results))]
    term_size = shutil.get_terminal_size(fallback=(120, 30)).columns or 120
    longest = max(len(max(names, key=len)), len(max(headers, key=len)), 25)
    width = int(min(longest, term_size / 2))
    rows = [[_cell(result.get(name)) for result in results] for name in names]
    per_table = int((term_size - width) / width)  # dataloader columns beside the metric column
    for start in range(0, len(headers), per_table):
        table_headers = [f"{stage} Metric".capitalize(), *headers[start : start + per_table]]
        table_rows = [[name, *row[start : start + per_table]] for name, row in zip(names, rows)]
        if is_available("rich"):  # optional: plain text without it
            _print_rich(table_headers, table_rows, width)
        else:
            _print_plain(table_headers, table_rows, width, term_size)


def _cell(value: Any) -> str:
    """Lightning's cell: the value as Python prints it (a tensor's item or list), or a space."""
    if value is None:
        return " "
    if hasattr(value, "numel") and hasattr(value, "tolist"):  # a tensor, without importing torch
        value = value.item() if value.numel() == 1 else value.tolist()
    return f"{value}"


def _print_rich(headers: list[str], rows: list[list[str]], width: int) -> None:
    from rich import get_console
    from rich.table import Column, Table

    columns = [Column(h, justify="center", style="magenta", width=width) for h in headers]
    columns[0].style = "cyan"
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    get_console().print(table)


def _print_plain(headers: list[str], rows: list[list[str]], width: int, term_size: int) -> None:
    row_format = f"{{:^{width}}}" * len(headers)
    half = int(term_size / 2)
    try:  # some terminals do not support the box-drawing character
        if sys.stdout.encoding is not None:
            "─".encode(sys.stdout.encoding)
        bar = "─" * term_size
    except UnicodeEncodeError:
        bar = "-" * term_size
    lines = [bar, row_format.format(*headers).rstrip(), bar]
    for metric, *values in rows:
        if len(metric) > half:  # a long name continues on the next lines, without values
            while len(metric) > half:
                lines.append(row_format.format(metric[:half], *values).rstrip())
                metric = metric[half:]
            values = [" "] * len(values)
        lines.append(row_format.format(metric, *values).rstrip())
    lines.append(bar)
    print(os.linesep.join(lines))
