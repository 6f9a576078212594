"""bitsandbytes quantization: the config's checks, which layers are quantized, and real 8-bit and
4-bit layers on the CPU loaded from a safetensors file, a sharded index and a trainer checkpoint.

The loaded model must equal the same model quantized from its materialized weights (the
bitsandbytes kernels decide the numbers), and stay close to the float model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer import ConfigurationError, MissingDependencyError, init_empty_weights
from trainer._imports import is_available
from trainer.big_modeling.quantization import (
    BnbQuantizationConfig,
    get_keys_to_not_convert,
    load_and_quantize_model,
    matches,
    replace_with_bnb_layers,
)
from trainer.checkpoint.format import write_checkpoint, write_model_files


class Net(torch.nn.Module):
    """inp -> norm -> body (Linear, GELU) -> head; 64 features, so 4-bit blocks fill up."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.norm(self.inp(x))))


def reference() -> Net:
    torch.manual_seed(0)
    return Net().eval()


# ---- the config (no bitsandbytes needed) ------------------------------------------------
def test_defaults_follow_accelerate():
    eight = BnbQuantizationConfig(load_in_8bit=True)
    assert (eight.torch_dtype, eight.target_dtype, eight.llm_int8_threshold) == (
        torch.float16,
        torch.int8,
        6.0,
    )
    four = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert (four.bnb_4bit_quant_type, four.torch_dtype, four.target_dtype) == (
        "fp4",
        torch.bfloat16,
        torch.uint8,
    )
    assert BnbQuantizationConfig(load_in_4bit=True, torch_dtype="fp32").torch_dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "choose exactly one"),
        ({"load_in_8bit": True, "load_in_4bit": True}, "choose exactly one"),
        ({"load_in_8bit": 1}, "load_in_8bit=1 \\(type int\\)\\): expected True or False"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, "expected 'fp4' or 'nf4'"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp64"}, "bnb_4bit_compute_dtype='fp64'"),
        ({"load_in_8bit": True, "torch_dtype": 16}, "torch_dtype=16"),
        ({"load_in_8bit": True, "llm_int8_threshold": "6"}, "expected a number"),
        ({"load_in_8bit": True, "skip_modules": "head"}, "expected a list of module names"),
        ({"load_in_8bit": True, "keep_in_fp32_modules": [1]}, "keep_in_fp32_modules=\\[1\\]"),
    ],
)
def test_bad_config_names_the_argument(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        BnbQuantizationConfig(**kwargs)


def test_threshold_with_4bit_warns():
    with pytest.warns(UserWarning, match="8-bit layers only"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=3.0)


def test_names_match_whole_dotted_segments():
    assert matches("model.lm_head", ["lm_head"]) and matches("layers.0.attn.q", ["layers.0"])
    assert not matches("layers.10.attn", ["layers.1"]) and not matches("lm_head2", ["lm_head"])


def test_default_skips_are_the_last_child_and_tied_weights():
    assert get_keys_to_not_convert(Net()) == ["head"]
    tied = torch.nn.Sequential(
        torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 8)
    )
    tied[2].weight = tied[0].weight
    assert get_keys_to_not_convert(tied) == ["0", "2"]

    class Base(Net):
        base_model_prefix = "model"  # a transformers base model: no head to keep

    assert get_keys_to_not_convert(Base()) == []


def test_missing_bitsandbytes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails
    with pytest.raises(MissingDependencyError, match=r"pip install 'trainer\[quantization\]'"):
        replace_with_bnb_layers(Net(), BnbQuantizationConfig(load_in_8bit=True), [])


def test_import_trainer_loads_neither_bitsandbytes_nor_pipelining():
    code = (
        "import sys, trainer; "
        "print([m for m in ('bitsandbytes', 'torch.distributed.pipelining') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- real layers on the CPU -------------------------------------------------------------
needs_bnb = pytest.mark.skipif(
    not is_available("bitsandbytes"), reason="pip install 'trainer[quantization]'"
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    state = reference().state_dict()
    save_file(state, root / "model.safetensors")
    (root / "sharded").mkdir()
    write_model_files(root / "sharded", state, max_shard_size=20_000)
    write_checkpoint(root / "checkpoint", {"state_dict": state, "epoch": 1})
    return {
        "safetensors file": root / "model.safetensors",
        "sharded index": root / "sharded" / "model.safetensors.index.json",
        "checkpoint directory": root / "checkpoint",
    }


@needs_bnb
def test_layer_selection_honours_skip_and_fp32_lists():
    config = BnbQuantizationConfig(load_in_8bit=True)
    model = Net()
    assert replace_with_bnb_layers(model, config, ["inp"]) == ["body.0", "head"]
    assert type(model.inp) is torch.nn.Linear and type(model.head).__name__ == "Linear8bitLt"
    assert not any(p.requires_grad for p in model.head.parameters())


@needs_bnb
@pytest.mark.parametrize("source", ["safetensors file", "sharded index", "checkpoint directory"])
@pytest.mark.parametrize("bits", [8, 4])
def test_loading_equals_quantizing_the_loaded_model(sources, source, bits):
    flags = (
        {"load_in_8bit": True}
        if bits == 8
        else {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    )
    config = BnbQuantizationConfig(**flags, keep_in_fp32_modules=["norm"], torch_dtype="fp32")
    with init_empty_weights():
        empty = Net()
    loaded = load_and_quantize_model(
        empty, config, weights_location=sources[source], device_map={"": "cpu"}
    )
    materialized = load_and_quantize_model(reference(), config)
    kinds = {name: type(module).__name__ for name, module in loaded.named_children()}
    layer = "Linear8bitLt" if bits == 8 else "Linear4bit"
    assert kinds == {"inp": layer, "norm": "LayerNorm", "body": "Sequential", "head": "Linear"}
    assert type(loaded.body[0]).__name__ == layer and loaded.is_loaded_in_8bit == (bits == 8)
    assert loaded.inp.weight.dtype == (torch.int8 if bits == 8 else torch.uint8)
    assert loaded.hf_device_map == {"": "cpu"}
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, again, exact = loaded(x), materialized(x), reference()(x)
    assert torch.equal(out, again)
    assert (out - exact).abs().max() < (0.01 if bits == 8 else 0.1)


@needs_bnb
def test_8bit_weights_are_bitsandbytes_row_wise_int8(sources):
    with init_empty_weights():
        empty = Net()
    model = load_and_quantize_model(
        empty,
        BnbQuantizationConfig(load_in_8bit=True),
        weights_location=sources["safetensors file"],
    )
    import bitsandbytes as bnb

    codes, scales, _ = bnb.functional.int8_vectorwise_quant(reference().inp.weight.detach().half())
    model(torch.randn(2, 64).half())  # the first forward moves codes and scales into the state
    assert torch.equal(model.inp.state.CB, codes) and torch.equal(model.inp.state.SCB, scales)
    assert model.head.weight.dtype == model.norm.weight.dtype == torch.float16  # torch_dtype


@needs_bnb
def test_skip_modules_and_fp32_modules_keep_their_dtypes():
    config = BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_use_double_quant=True, skip_modules=["inp"], keep_in_fp32_modules=["body"]
    )  # fmt: skip
    model = load_and_quantize_model(reference(), config)
    assert type(model.inp) is torch.nn.Linear and model.inp.weight.dtype == torch.float16
    assert type(model.body[0]) is torch.nn.Linear and model.body[0].weight.dtype == torch.float32
    assert type(model.head).__name__ == "Linear4bit" and model.head.weight.quant_state.nested


@needs_bnb
def test_auto_device_map_on_the_cpu(sources):
    with init_empty_weights():
        empty = Net()
    model = load_and_quantize_model(
        empty,
        BnbQuantizationConfig(load_in_8bit=True),
        sources["safetensors file"],
        device_map="auto",
    )
    assert set(model.hf_device_map.values()) == {"cpu"}


@needs_bnb
def test_an_empty_model_needs_weights_and_disk_is_refused(sources):
    with init_empty_weights():
        empty = Net()
    config = BnbQuantizationConfig(load_in_8bit=True)
    with pytest.raises(ConfigurationError, match="weights_location is None"):
        load_and_quantize_model(empty, config)
    with pytest.raises(ConfigurationError, match="not offloaded to disk"):
        load_and_quantize_model(
            empty, config, sources["safetensors file"], device_map={"": "cpu", "head": "disk"}
        )
