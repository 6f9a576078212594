"""``trainer estimate-memory``: its figures against the bytes a real model and optimizer hold.

The same small model is built twice: on meta through TARGET (nothing allocated), and for real
in each dtype, where one forward, backward and optimizer step are run; then the parameter,
buffer, gradient and optimizer-state bytes (sum of numel * element_size) are compared exactly.
"""

from __future__ import annotations

import math
import re
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from trainer.checkpoint.format import write_model_files
from trainer.cli import estimate_memory as em
from trainer.cli.main import main

MODEL_SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(7, 13), nn.BatchNorm1d(13), nn.ReLU(), nn.Linear(13, 5))
        model[0].bias.requires_grad_(False)  # a frozen parameter: no gradient, no state
        return model

    def needs_args(width):
        return nn.Linear(width, width)

    def not_a_model():
        return 3
    """
)


@pytest.fixture
def target(tmp_path, monkeypatch) -> str:
    (tmp_path / "em_models.py").write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("COLUMNS", "160")
    return "em_models:make"


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _measure(dtype: torch.dtype, optimizer: str) -> dict[str, int]:
    """Bytes held after one real step of ``optimizer`` on the model in ``dtype``."""
    import em_models  # type: ignore[import-not-found]  # written by the fixture

    model = em_models.make().to(dtype)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = {
        "adamw": lambda: torch.optim.AdamW(trainable, lr=1e-3),
        "adam": lambda: torch.optim.Adam(trainable, lr=1e-3),
        "sgd": lambda: torch.optim.SGD(trainable, lr=1e-3),
        "sgd-momentum": lambda: torch.optim.SGD(trainable, lr=1e-3, momentum=0.9),
    }[optimizer]()
    model(torch.randn(4, 7, dtype=dtype)).float().pow(2).mean().backward()
    opt.step()
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": _nbytes(model.parameters()),
        "buffers": _nbytes(model.buffers()),
        "gradients": _nbytes(p.grad for p in model.parameters() if p.grad is not None),
        "states": _nbytes(states),
        "count": sum(p.numel() for p in model.parameters()),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "sgd-momentum"])
def test_figures_equal_the_bytes_of_a_real_optimizer_step(target, dtype, optimizer):
    tensors = em.load_target(target)
    assert all(t.shape for t in tensors if t.is_parameter)  # shapes read from the meta model
    figures = em.estimate(tensors, dtype, optimizer=optimizer)
    real = _measure(dtype, optimizer)
    assert figures.parameters == real["count"] == 7 * 13 + 13 + 2 * 13 + 13 * 5 + 5
    assert figures.parameter_bytes == real["parameters"]
    assert figures.buffer_bytes == real["buffers"]  # running stats in dtype, int64 counter
    assert figures.gradient_bytes == real["gradients"]
    assert figures.optimizer_bytes == real["states"]
    assert figures.training_bytes == sum(real[k] for k in ("parameters", "buffers", "gradients", "states"))  # fmt: skip
    # The largest layer is the 7x13 Linear (its frozen bias included).
    assert (figures.largest_layer, figures.largest_layer_bytes) == (
        "0",
        (7 * 13 + 13) * dtype.itemsize,
    )


def test_sharding_divides_what_each_strategy_shards(target):
    tensors = em.load_target(target)
    whole = em.estimate(tensors, torch.float32)
    p, b, g, s = (
        whole.parameter_bytes,
        whole.buffer_bytes,
        whole.gradient_bytes,
        whole.optimizer_bytes,
    )
    n = 3

    def share(x: int) -> int:
        return math.ceil(x / n)

    expected = {
        ("ddp", 0): (p, g, s),
        ("deepspeed", 0): (p, g, s),
        ("deepspeed", 1): (p, g, share(s)),
        ("deepspeed", 2): (p, share(g), share(s)),
        ("deepspeed", 3): (share(p), share(g), share(s)),
        ("fsdp", 3): (share(p), share(g), share(s)),
    }
    for (strategy, stage), (params, grads, states) in expected.items():
        figures = em.estimate(tensors, torch.float32, sharding=em.Sharding(strategy, stage, n))
        assert figures.per_process == {
            "parameters": params,
            "buffers": b,  # never divided
            "gradients": grads,
            "optimizer states": states,
            "total": params + b + grads + states,
        }, (strategy, stage)


def test_command_prints_a_table_per_dtype_with_exact_digits(target, capsys):
    status = main(["estimate-memory", target, "--dtypes", "float32", "bfloat16",
                   "--strategy", "deepspeed", "--stage", "1", "--num_processes", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert out.count("em_models:make in float32") == 1 and "em_models:make in bfloat16" in out
    assert len(re.findall(r"│ parameters +│ +200 │", out)) == 2  # exact count, in each table
    for dtype in (torch.float32, torch.bfloat16):
        figures = em.estimate(
            em.load_target(target), dtype, sharding=em.Sharding("deepspeed", 1, 2)
        )
        for nbytes in (figures.inference_bytes, figures.gradient_bytes, figures.optimizer_bytes,
                       figures.training_bytes, figures.per_process["total"]):  # fmt: skip
            assert f"{nbytes:,} B" in out
    assert "largest layer (0)" in out and "deepspeed ZeRO-1" in out and "(2 processes)" in out
    assert "Activations are not included" in out and "estimate" in out


def test_size_format_keeps_four_significant_digits():
    assert em._size(1536) == "1.500 KiB (1,536 B)"
    assert em._size(3 * 2**30 + 2**20) == "3.001 GiB (3,222,274,048 B)"
    assert em._size(123_456_789) == "117.7 MiB (123,456,789 B)"
    assert em._size(999) == "999 B"


def test_safetensors_file_and_index_targets_read_headers_only(target, tmp_path, capsys):
    import em_models  # type: ignore[import-not-found]  # written by the fixture

    state = em_models.make().state_dict()
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "sharded").mkdir()
    write_model_files(tmp_path / "sharded", state, max_shard_size=400)
    floats = sum(v.numel() for v in state.values() if v.is_floating_point())
    for path in (tmp_path / "model.safetensors", tmp_path / "sharded" / "model.safetensors.index.json",
                 tmp_path / "sharded"):  # fmt: skip
        figures = em.estimate(em.load_target(str(path)), torch.bfloat16)
        assert figures.parameters == floats  # every floating-point tensor counts as trainable
        assert figures.buffer_bytes == 8  # num_batches_tracked, int64, never cast
        assert figures.largest_layer == "0"
    assert (
        main(["estimate-memory", str(tmp_path / "model.safetensors"), "--dtypes", "float16"]) == 0
    )
    assert f"{floats:,}" in capsys.readouterr().out


def test_errors_name_the_fix(target, tmp_path, capsys):
    torch.save({"w": torch.zeros(2)}, tmp_path / "old.bin")
    cases = {
        "no_such_module:make": "cannot import 'no_such_module'",
        "em_models:missing": "has no attribute 'missing'",
        "em_models:needs_args": "must build the model without arguments",
        "em_models:not_a_model": r"returned 3 \(type int\); expected a torch.nn.Module",
        "plain-word": "not a file and not 'package.module:ClassOrFactory'",
        str(tmp_path / "old.bin"): "is a pickle",
    }
    for bad, message in cases.items():
        assert main(["estimate-memory", bad]) == 1
        assert re.search(message, capsys.readouterr().err), bad
    assert main(["estimate-memory", target, "--strategy", "fsdp", "--stage", "1"]) == 1
    assert "--stage 1 applies to --strategy deepspeed" in capsys.readouterr().err
    assert main(["estimate-memory", target, "--num_processes", "0"]) == 1
    assert "expected 1 or more" in capsys.readouterr().err
