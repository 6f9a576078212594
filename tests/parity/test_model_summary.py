"""Parity by difference: the model summary printed when fit starts, on lightning.pytorch 2.6 and on
trainer — each row's name, type, parameters, mode, FLOPs and (with ``example_input_array``)
input and output sizes, the "Other params" row, and the totals (parameters, size in MB, modules
in train / eval mode, FLOPs).

Lightning's values are read from its own summary (``lightning.pytorch.utilities.model_summary``)
taken at ``on_fit_start``, when its ModelSummary callback takes it; trainer's from the table its
ModelSummary prints (parsed). Lightning's run is the expected value.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from rich.console import Console

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.utilities import model_summary as pl_summary  # noqa: E402


def _module(fw: Any, recipe: str) -> Any:
    class Summarized(fw.Module):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.backbone = torch.nn.Sequential(
                torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU()
            )
            self.head = torch.nn.Linear(16, 1)
            self.backbone[1].eval()  # a frozen statistics layer: "eval" in the Mode column
            self.head.requires_grad_(False)
            if recipe == "own_parameter":
                self.scale = torch.nn.Parameter(torch.ones(3))
            if recipe == "tuple_input":
                self.example_input_array = (torch.zeros(2, 4), torch.ones(2, 1))
            elif recipe != "no_example":
                self.example_input_array = torch.zeros(3, 4)

        def forward(self, x, shift=None):
            out = self.head(self.backbone(x))
            return out if shift is None else out + shift

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.backbone.parameters(), lr=0.05)

    return Summarized()


def _lightning(recipe: str, max_depth: int) -> dict[str, Any]:
    taken: dict[str, Any] = {}

    class Take(pl.Callback):
        def on_fit_start(self, trainer, module):
            summary = pl_summary.ModelSummary(module, max_depth=max_depth)
            has_sizes = module.example_input_array is not None
            count = pl_summary.get_human_readable_count
            rows = [
                [
                    name,
                    kind,
                    count(params).strip(),
                    "train" if mode else "eval",
                    count(sum(f.values())).strip(),
                ]
                + ([str(i), str(o)] if has_sizes else [])
                for name, kind, params, mode, f, i, o in zip(
                    summary.layer_names,
                    summary.layer_types,
                    summary.param_nums,
                    summary.training_modes,
                    summary.flop_counts.values(),
                    summary.in_sizes,
                    summary.out_sizes,
                    strict=True,
                )
            ]
            leftover = summary.total_parameters - summary.total_layer_params
            if leftover > 0:
                rows.append(["Other params", "n/a", count(leftover).strip(), "n/a", "n/a"])
                rows[-1] += ["n/a", "n/a"] if has_sizes else []
            modes = summary.total_training_modes
            taken.update(
                rows=rows,
                totals={
                    "Trainable params": count(summary.trainable_parameters).strip(),
                    "Total params": count(summary.total_parameters).strip(),
                    "Total estimated model params size (MB)": f"{summary.model_size:,.3f}",
                    "Modules in train mode": str(modes["train"]),
                    "Modules in eval mode": str(modes["eval"]),
                    "Total FLOPs": count(summary.total_flops).strip(),
                },
            )

    fit = LIGHTNING.trainer(**quiet(max_steps=1, callbacks=[Take()]))
    fit.fit(_module(LIGHTNING, recipe), loader(4))
    return taken


def _trainer(recipe: str, max_depth: int) -> dict[str, Any]:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=200)
    summary = TRAINER.callbacks.ModelSummary(max_depth=max_depth, console=console)
    fit = TRAINER.trainer(**quiet(max_steps=1, callbacks=[summary]))
    fit.fit(_module(TRAINER, recipe), loader(4))
    lines = buffer.getvalue().splitlines()
    rows = [
        [cell.strip() for cell in line.split("│")[2:-1]]  # no index column
        for line in lines
        if line.startswith("│")
    ]
    totals = dict(line.split(": ", 1) for line in lines if ": " in line and "│" not in line)
    totals.pop("Non-trainable params")
    return {"rows": rows, "totals": totals}


@pytest.mark.parametrize(
    ("recipe", "max_depth"),
    [
        ("tensor_input", 1),
        ("tensor_input", 2),
        ("tensor_input", -1),
        ("tuple_input", 2),
        ("no_example", 2),
        ("own_parameter", 1),
    ],
)
def test_the_summary_at_fit_start_equals_lightnings(recipe: str, max_depth: int) -> None:
    expected = _lightning(recipe, max_depth)
    actual = _trainer(recipe, max_depth)
    assert expected["rows"]
    assert actual == expected
