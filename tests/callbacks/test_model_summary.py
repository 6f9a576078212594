"""Tests of trainer/callbacks/model_summary.py: counts, depth, frozen params, sizes, the table."""

from __future__ import annotations

import io
import types

import pytest
import torch
from rich.console import Console

from trainer.callbacks.model_summary import (
    LayerSummary,
    ModelSummary,
    format_count,
    summarize,
    total_size_bytes,
    trace_example,
)
from trainer.errors import ConfigurationError


def make_mlp() -> torch.nn.Sequential:
    # Linear(10, 5): 10*5 weights + 5 biases = 55; Linear(5, 2): 5*2 + 2 = 12; ReLU: 0.
    return torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


def make_nested() -> torch.nn.Sequential:
    # encoder: Linear(4, 3) = 4*3 + 3 = 15, BatchNorm1d(3) = 3 weights + 3 biases = 6 -> 21
    # head: Linear(3, 1) = 3 + 1 = 4. Total 25.
    encoder = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    return torch.nn.Sequential(
        torch.nn.ModuleDict({"encoder": encoder}),
        torch.nn.Linear(3, 1),
    )


def captured_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=120), buffer


def test_summarize_sequential_exact_counts() -> None:
    rows = summarize(make_mlp())
    assert rows == [
        LayerSummary("0", "Linear", 55, 55),
        LayerSummary("1", "ReLU", 0, 0),
        LayerSummary("2", "Linear", 12, 12),
    ]
    assert [row.non_trainable_params for row in rows] == [0, 0, 0]


def test_summarize_nested_depth() -> None:
    model = make_nested()
    assert [(r.name, r.type, r.params) for r in summarize(model, max_depth=1)] == [
        ("0", "ModuleDict", 21),
        ("1", "Linear", 4),
    ]
    assert [(r.name, r.params) for r in summarize(model, max_depth=2)] == [
        ("0", 21),
        ("0.encoder", 21),
        ("1", 4),
    ]
    every = [(r.name, r.type, r.params) for r in summarize(model, max_depth=-1)]
    assert every == [
        ("0", "ModuleDict", 21),
        ("0.encoder", "Sequential", 21),
        ("0.encoder.0", "Linear", 15),
        ("0.encoder.1", "BatchNorm1d", 6),
        ("1", "Linear", 4),
    ]
    assert summarize(model, max_depth=3) == summarize(model, max_depth=-1)
    assert summarize(model, max_depth=0) == []


def test_frozen_params_are_non_trainable() -> None:
    model = make_mlp()
    model[0].requires_grad_(False)
    model[2].bias.requires_grad_(False)  # 2 of the 12
    rows = summarize(model)
    assert (rows[0].params, rows[0].trainable_params, rows[0].non_trainable_params) == (55, 0, 55)
    assert (rows[2].params, rows[2].trainable_params, rows[2].non_trainable_params) == (12, 10, 2)


def test_shared_parameter_counts_once_per_row() -> None:
    shared = torch.nn.Linear(3, 3)  # 9 + 3 = 12
    model = torch.nn.Sequential(shared, shared)
    rows = summarize(model)
    # named_modules yields a shared module once, under its first name.
    assert [(r.name, r.params) for r in rows] == [("0", 12)]
    assert total_size_bytes(model) == 12 * 4


def test_total_size_bytes_float32_and_bfloat16() -> None:
    model = make_mlp()  # 67 parameters
    assert total_size_bytes(model) == 67 * 4
    assert total_size_bytes(model.to(torch.bfloat16)) == 67 * 2


def test_total_size_bytes_counts_buffers() -> None:
    # BatchNorm1d(5): weight + bias = 10 float32 params; running_mean + running_var = 10 float32
    # buffers; num_batches_tracked = 1 int64 buffer (8 bytes).
    assert total_size_bytes(torch.nn.BatchNorm1d(5)) == (10 + 10) * 4 + 8


def test_meta_device_counts_by_numel() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(1000, 1000))  # 1000*1000 + 1000
    rows = summarize(model)
    assert rows[0].params == 1_001_000
    assert total_size_bytes(model) == 1_001_000 * 4


def test_lazy_parameters_count_zero() -> None:
    model = torch.nn.Sequential(torch.nn.LazyLinear(3))
    assert summarize(model)[0].params == 0
    assert total_size_bytes(model) == 0


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0, "0"),
        (67, "67"),
        (999, "999"),
        (1000, "1.0 K"),
        (1234, "1.2 K"),
        (99_949, "99.9 K"),
        (123_456, "123 K"),  # from 100 on, no decimal (Lightning's rule)
        (999_960, "999 K"),
        (3_400_000, "3.4 M"),
        (7_000_000_000, "7.0 B"),
        (2 * 10**12, "2.0 T"),
        (5 * 10**15, "5,000 T"),
    ],
)
def test_format_count(number: int, text: str) -> None:
    assert format_count(number) == text


def test_printed_table_has_rows_and_totals() -> None:
    console, buffer = captured_console()
    model = make_mlp()
    model[0].requires_grad_(False)
    ModelSummary(console=console).print_summary(model)
    out = buffer.getvalue()
    for text in ("Name", "Type", "Params", "Trainable", "Non-trainable", "Linear", "ReLU"):
        assert text in out
    assert "Trainable params: 12\n" in out
    assert "Non-trainable params: 55\n" in out
    assert "Total params: 67\n" in out
    assert "Total estimated model params size (MB): 0.000\n" in out  # 268 bytes


def test_printed_totals_use_units() -> None:
    console, buffer = captured_console()
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000))  # 1_001_000 params, 4_004_000 bytes
    ModelSummary(console=console).print_summary(model)
    out = buffer.getvalue()
    assert "Total params: 1.0 M\n" in out
    assert "Total estimated model params size (MB): 4.004\n" in out


def test_on_fit_start_prints_on_rank_zero_only() -> None:
    console, buffer = captured_console()
    callback = ModelSummary(console=console)
    callback.on_fit_start(types.SimpleNamespace(is_global_zero=False), make_mlp())
    assert buffer.getvalue() == ""
    callback.on_fit_start(types.SimpleNamespace(is_global_zero=True), make_mlp())
    assert "Total params: 67" in buffer.getvalue()


def test_max_depth_zero_prints_nothing() -> None:
    console, buffer = captured_console()
    ModelSummary(max_depth=0, console=console).on_fit_start(
        types.SimpleNamespace(is_global_zero=True), make_mlp()
    )
    assert buffer.getvalue() == ""


@pytest.mark.parametrize("bad", [-2, 1.5, "1", True])
def test_bad_max_depth_names_the_fix(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"max_depth.*Pass e.g. max_depth=1"):
        ModelSummary(max_depth=bad)  # type: ignore[arg-type]  # the wrong type is the test
    with pytest.raises(ConfigurationError, match=r"summarize\(max_depth"):
        summarize(make_mlp(), max_depth=bad)  # type: ignore[arg-type]  # the wrong type is the test


class _Counted(torch.nn.Module):
    """Linear(4, 8) -> BatchNorm1d (kept in eval) -> Linear(8, 2); counts its forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
        self.head = torch.nn.Linear(8, 2)
        self.body[1].eval()
        self.forwards: list[bool] = []

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.forwards.append(torch.is_grad_enabled())
        return self.head(self.body(x)) * scale


def test_trace_example_records_sizes_flops_and_puts_modes_back() -> None:
    model = _Counted()
    trace = trace_example(model, {"x": torch.zeros(5, 4), "scale": 2.0}, max_depth=2)
    assert trace.in_sizes == {"body": [5, 4], "body.0": [5, 4], "body.1": [5, 8], "head": [5, 8]}
    assert trace.out_sizes["head"] == [5, 2]
    assert trace.flops == {"body": 2 * 5 * 4 * 8, "body.0": 2 * 5 * 4 * 8, "body.1": 0, "head": 160}
    assert trace.total_flops == 320 + 160
    assert model.forwards == [False]  # one forward, under no_grad
    assert model.training and model.body[0].training and not model.body[1].training


def test_printed_table_has_lightnings_columns_and_totals_with_an_example() -> None:
    console, buffer = captured_console()
    model = _Counted()
    model.example_input_array = torch.zeros(3, 4)
    ModelSummary(max_depth=2, console=console).print_summary(model)
    out = buffer.getvalue()
    for text in ("Mode", "FLOPs", "In sizes", "Out sizes", "[3, 8]", "eval"):
        assert text in out
    assert "Modules in train mode: 3\n" in out  # body, body.0, head
    assert "Modules in eval mode: 1\n" in out
    assert "Total FLOPs: 288\n" in out  # 2*3*4*8 + 2*3*8*2
    assert "Total estimated model params size (MB): 0.000\n" in out


def test_the_example_forward_runs_on_every_rank_and_prints_on_rank_zero() -> None:
    """A sharded model's forward needs every process: each runs it, rank zero alone prints."""
    console, buffer = captured_console()
    model = _Counted()
    model.example_input_array = torch.zeros(3, 4)
    callback = ModelSummary(console=console)
    callback.on_fit_start(types.SimpleNamespace(is_global_zero=False), model)
    assert buffer.getvalue() == "" and len(model.forwards) == 1
    callback.on_fit_start(types.SimpleNamespace(is_global_zero=True), model)
    assert "In sizes" in buffer.getvalue() and len(model.forwards) == 2


def test_parameters_of_the_module_itself_get_an_other_params_row() -> None:
    console, buffer = captured_console()
    model = make_mlp()
    model.register_parameter("scale", torch.nn.Parameter(torch.ones(7)))
    ModelSummary(console=console).print_summary(model)
    row = next(line for line in buffer.getvalue().splitlines() if "Other params" in line)
    assert [cell.strip() for cell in row.split("│")[1:-1]][2:4] == ["n/a", "7"]
