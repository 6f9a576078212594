"""FP8Precision: backend choice, module conversion, the hardware check and the missing packages.

On a CPU the conversion (torchao's Float8Linear swap) and every error path are tested; the
TransformerEngine wiring is tested against a stand-in package, since TransformerEngine needs CUDA
to install. Training in fp8 for real (loss against bf16) is in the GPU tests at the end, skipped
without a GPU of compute capability 8.9 or newer.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import trainer
from trainer._imports import is_available
from trainer.errors import ConfigurationError
from trainer.precision import FP8Precision, resolve_precision
from trainer.precision.fp8 import TORCHAO_RECIPES

ROOT = Path(__file__).resolve().parents[2]
needs_torchao = pytest.mark.skipif(
    not is_available("torchao"), reason="the 'fp8' extra (torchao) is not installed"
)
_HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
needs_fp8_gpu = pytest.mark.skipif(
    not _HAS_FP8_GPU, reason="needs a CUDA GPU with compute capability >= 8.9"
)
_CPU_ERROR = (
    "precision='fp8' (backend='torchao') needs an NVIDIA GPU with compute capability 8.9 or "
    "newer (L4, L40, H100, H200, B200) for its float8 matmuls, but this process runs on 'cpu'. "
    "Run on such a GPU, or choose precision='bf16-mixed'."
)


class _Net(torch.nn.Module):
    """Layers of every kind the conversion meets: eligible, odd-sized, nested, not Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(64, 256)
        self.blocks = torch.nn.Sequential(
            torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 48)
        )
        self.norm = torch.nn.LayerNorm(48)
        self.head = torch.nn.Linear(48, 10)
        self.odd = torch.nn.Linear(10, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.odd(self.head(self.norm(self.blocks(self.embed(x)))))


# ---- conversion (CPU) ----------------------------------------------------------------------
@needs_torchao
def test_conversion_swaps_eligible_linears_and_says_why_others_stay():
    model = _Net()
    weight = model.embed.weight
    precision = FP8Precision(backend="torchao")
    converted = precision.convert_module(model)
    assert converted is model
    assert precision.converted_layers == ["embed", "blocks.0", "blocks.2"]
    assert precision.skipped_layers == {
        "head": "out_features=10 is not a multiple of 16 (float8 matmuls need 16)",
        "odd": "in_features=10 is not a multiple of 16 (float8 matmuls need 16)",
    }
    assert [type(m).__name__ for m in (model.embed, model.blocks[0], model.head)] == [
        "Float8Linear",
        "Float8Linear",
        "Linear",
    ]
    assert type(model.norm) is torch.nn.LayerNorm
    # The parameters are the same objects: an optimizer built before conversion still applies.
    assert model.embed.weight is weight and weight.dtype == torch.float32


@needs_torchao
def test_module_filter_fn_keeps_chosen_layers_in_high_precision():
    precision = FP8Precision("torchao", module_filter_fn=lambda layer, fqn: fqn != "embed")
    model = precision.convert_module(_Net())
    assert precision.converted_layers == ["blocks.0", "blocks.2"]
    assert precision.skipped_layers["embed"] == "module_filter_fn returned False"
    assert type(model.embed) is torch.nn.Linear


@needs_torchao
def test_a_root_linear_and_a_second_conversion():
    from torchao.float8.float8_linear import Float8Linear

    precision = FP8Precision("torchao")
    layer = precision.convert_module(torch.nn.Linear(32, 64))
    assert isinstance(layer, Float8Linear) and precision.converted_layers == [""]
    model = precision.convert_module(precision.convert_module(_Net()))
    assert precision.converted_layers == ["embed", "blocks.0", "blocks.2"]
    assert type(model.embed) is Float8Linear and not list(model.embed.children())  # not rewrapped
    assert set(precision.skipped_layers) == {"head", "odd"}


@needs_torchao
def test_converted_model_trains_on_cpu_close_to_fp32():
    # torch emulates the scaled fp8 matmul on a CPU: slow, but it proves the swap is real.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
    reference = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16)
    )
    reference.load_state_dict(model.state_dict())
    model = FP8Precision("torchao").convert_module(model)
    x = torch.randn(32, 64)
    out, expected = model(x), reference(x)
    assert not torch.equal(out, expected)  # the matmuls ran in float8...
    torch.testing.assert_close(out, expected, atol=0.1, rtol=0.1)  # ...at fp8 accuracy
    out.square().mean().backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0


@needs_torchao
@pytest.mark.parametrize("recipe", TORCHAO_RECIPES)
def test_torchao_recipe_names(recipe):
    from torchao.float8 import Float8LinearConfig

    precision = FP8Precision("torchao", recipe=recipe)
    assert precision.recipe == Float8LinearConfig.from_recipe_name(recipe)
    assert repr(precision) == f"FP8Precision(backend='torchao', recipe={recipe!r})"


@needs_torchao
def test_a_float8_linear_config_is_used_as_is():
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig(emulate=True)
    precision = FP8Precision("torchao", recipe=config)
    assert precision.recipe is config
    precision.convert_module(_Net())
    assert precision.converted_layers == ["embed", "blocks.0", "blocks.2"]


@needs_torchao
def test_layers_inside_the_trainer_are_named_as_in_the_users_module():
    """The Trainer hands its StepRouter (the TrainModule under ``.module``) to the engine: the
    names, and the fqn a module_filter_fn sees, were 'module.net.0' before (found on an H200)."""
    from trainer.trainer.prepare import StepRouter

    seen: list[str] = []
    precision = FP8Precision(
        "torchao", module_filter_fn=lambda layer, fqn: seen.append(fqn) or fqn != "net.embed"
    )
    module = trainer.TrainModule()
    module.net = _Net()
    router = StepRouter(module)
    assert precision.convert_module(router) is router and router.module is module
    assert precision.converted_layers == ["net.blocks.0", "net.blocks.2"]
    assert "net.embed" in precision.skipped_layers and "net.blocks.0" in seen
    assert type(module.net.blocks[0]).__name__ == "Float8Linear"


@needs_torchao
def test_defaults_and_names():
    precision = resolve_precision("fp8")
    assert isinstance(precision, FP8Precision)
    assert precision.backend == "torchao"  # "auto" with torchao installed
    assert precision.name == "fp8" and precision.mixed_precision == "fp8"
    assert precision.compute_dtype == torch.bfloat16 and precision.param_dtype is None
    assert repr(precision) == "FP8Precision(backend='torchao', recipe='tensorwise')"


# ---- argument errors -------------------------------------------------------------------------
def test_unknown_backend():
    with pytest.raises(ConfigurationError) as info:
        FP8Precision(backend="msamp")
    assert str(info.value) == (
        "FP8Precision(backend='msamp' (type str)): expected one of 'auto', 'torchao', "
        "'transformer_engine'."
    )


def test_unknown_torchao_recipe():
    with pytest.raises(ConfigurationError) as info:
        FP8Precision("torchao", recipe="delayed")
    assert str(info.value) == (
        "FP8Precision(recipe='delayed' (type str)): torchao's recipes are 'tensorwise', "
        "'rowwise', 'rowwise_with_gw_hp'; or pass a torchao.float8.Float8LinearConfig."
    )


@needs_torchao
def test_a_foreign_recipe_object_for_torchao():
    with pytest.raises(ConfigurationError, match=r"A TransformerEngine recipe needs backend="):
        FP8Precision("torchao", recipe=object())


def test_module_filter_fn_is_for_torchao_only():
    with pytest.raises(ConfigurationError, match=r"only the torchao backend converts layers"):
        FP8Precision("transformer_engine", module_filter_fn=lambda layer, fqn: True)


# ---- the hardware check ----------------------------------------------------------------------
@needs_torchao
def test_setup_on_cpu_names_what_is_missing_and_the_fix():
    with pytest.raises(ConfigurationError) as info:
        FP8Precision("torchao").setup(torch.device("cpu"))
    assert str(info.value) == _CPU_ERROR


@needs_torchao
def test_setup_on_an_older_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ConfigurationError) as info:
        FP8Precision("torchao").setup(torch.device("cuda", 0))
    assert str(info.value) == (
        "precision='fp8' (backend='torchao') needs an NVIDIA GPU with compute capability 8.9 "
        "or newer (L4, L40, H100, H200, B200) for its float8 matmuls, but cuda:0 is a NVIDIA "
        "A100 with compute capability 8.0. Run on such a GPU, or choose precision='bf16-mixed'."
    )


@needs_torchao
def test_setup_on_an_fp8_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    precision = FP8Precision("torchao")
    precision.setup(torch.device("cuda", 0))
    assert precision.device_type == "cuda"


@needs_torchao
def test_trainer_and_accelerator_reach_the_hardware_error_on_cpu():
    with pytest.raises(ConfigurationError) as info:
        trainer.Trainer(precision="fp8", accelerator="cpu")
    assert str(info.value) == _CPU_ERROR
    with pytest.raises(ConfigurationError) as info:
        trainer.Accelerator(mixed_precision="fp8", cpu=True)
    assert str(info.value) == _CPU_ERROR


# ---- missing packages (subprocesses: sys.modules[name] = None hides an installed package) ---
_SHOW = """
    import trainer
    from trainer.errors import MissingDependencyError
    from trainer.precision import FP8Precision

    def show(build):
        try:
            build()
        except MissingDependencyError as err:
            print(err)
"""


def _run_hidden(hidden: list[str], calls: str) -> list[str]:
    """Print the MissingDependencyError of each ``show(...)`` in ``calls``, ``hidden`` hidden."""
    script = "import sys\n"
    script += "".join(f"sys.modules[{name!r}] = None\n" for name in hidden)
    script += textwrap.dedent(_SHOW) + textwrap.dedent(calls)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_hidden_torchao_raises_missing_dependency_naming_the_extra():
    lines = _run_hidden(
        ["torchao", "transformer_engine"],
        """
        show(lambda: FP8Precision(backend="torchao"))
        show(lambda: FP8Precision())
        show(lambda: trainer.Trainer(precision="fp8"))
        """,
    )
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        "precision='fp8' (torchao) needs the package 'torchao', which is not installed ("
    )
    assert lines[0].endswith("Install it with: pip install 'trainer[fp8]'")
    auto = (
        "precision='fp8' needs torchao or TransformerEngine, and neither is installed. Install "
        "torchao with: pip install 'trainer[fp8]' (or TransformerEngine with: "
        "pip install 'trainer[fp8-te]')."
    )
    assert lines[1:] == [auto, auto]


def test_missing_transformer_engine_names_its_extra():
    lines = _run_hidden(
        ["transformer_engine"],
        'show(lambda: FP8Precision(backend="transformer_engine"))\n',
    )
    assert len(lines) == 1 and lines[0].startswith(
        "precision='fp8' (TransformerEngine) needs the package 'transformer_engine'"
    )
    assert lines[0].endswith("Install it with: pip install 'trainer[fp8-te]'")


# ---- TransformerEngine wiring, against a stand-in package ------------------------------------
@pytest.fixture
def fake_te(monkeypatch) -> types.SimpleNamespace:
    """A stand-in for transformer_engine: records each fp8_autocast and its recipe."""
    calls: list[tuple[bool, object]] = []

    class Recipe:
        pass

    class DelayedScaling(Recipe):
        pass

    @contextlib.contextmanager
    def fp8_autocast(enabled: bool, fp8_recipe: object) -> Iterator[None]:
        calls.append((enabled, fp8_recipe))
        yield

    class Linear(torch.nn.Linear):
        pass

    Linear.__module__ = "transformer_engine.pytorch.module.linear"
    root = types.ModuleType("transformer_engine")
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.fp8_autocast = fp8_autocast
    pytorch.Linear = Linear
    common = types.ModuleType("transformer_engine.common")
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Recipe, recipe.DelayedScaling = Recipe, DelayedScaling
    for name, module in [
        ("transformer_engine", root),
        ("transformer_engine.pytorch", pytorch),
        ("transformer_engine.common", common),
        ("transformer_engine.common.recipe", recipe),
    ]:
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(calls=calls, Linear=Linear, DelayedScaling=DelayedScaling)


def test_transformer_engine_region_and_layer_check(fake_te):
    precision = FP8Precision(backend="transformer_engine")
    assert isinstance(precision.recipe, fake_te.DelayedScaling)
    model = torch.nn.Sequential(fake_te.Linear(32, 32), torch.nn.Linear(32, 4))
    assert precision.convert_module(model) is model
    assert precision.converted_layers == ["0"]
    assert precision.skipped_layers == {"1": "a torch.nn.Linear, not a TransformerEngine layer"}
    precision.device_type = "cpu"  # what setup() records; the region itself is device-agnostic
    with precision.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert fake_te.calls == [(True, precision.recipe)]


def test_transformer_engine_needs_its_layers(fake_te):
    with pytest.raises(ConfigurationError) as info:
        FP8Precision("transformer_engine").convert_module(torch.nn.Linear(32, 32))
    assert str(info.value) == (
        "FP8Precision(backend='transformer_engine'): Linear has no TransformerEngine layer, so "
        "fp8_autocast would change nothing. Build it from transformer_engine.pytorch modules "
        "(te.Linear, te.LayerNormMLP, te.TransformerLayer), or use backend='torchao', which "
        "converts nn.Linear itself."
    )


def test_transformer_engine_rejects_recipe_names(fake_te):
    with pytest.raises(ConfigurationError, match=r"Recipe names are torchao's"):
        FP8Precision("transformer_engine", recipe="tensorwise")
    recipe = fake_te.DelayedScaling()
    assert FP8Precision("transformer_engine", recipe=recipe).recipe is recipe


# ---- real fp8 training (GPU with compute capability >= 8.9) ----------------------------------
class _Regression(trainer.TrainModule):
    """An MLP whose dims are multiples of 16, on a fixed random regression task."""

    def __init__(self, layers: torch.nn.Module) -> None:
        super().__init__()
        self.net = layers
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _regression_loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 256, generator=generator)
    y = torch.tanh(x @ torch.randn(256, 16, generator=generator) / 16)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


def _train(precision: object, layers: torch.nn.Module) -> list[float]:
    module = _Regression(layers)
    trainer.Trainer(
        accelerator="cuda",
        precision=precision,
        max_epochs=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    ).fit(module, _regression_loader())
    return module.losses


def _tail(losses: list[float]) -> float:
    """The mean loss of the last 8 steps (one step's loss is noisy)."""
    return sum(losses[-8:]) / 8


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 16))


@needs_torchao
@needs_fp8_gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_fp8_training_matches_bf16(recipe):
    bf16 = _train("bf16-mixed", _mlp())
    precision = FP8Precision("torchao", recipe=recipe)
    fp8 = _train(precision, _mlp())
    assert precision.converted_layers == ["net.0", "net.2"]  # names in the TrainModule
    assert _tail(fp8) < 0.5 * fp8[0]  # it learns
    assert abs(_tail(fp8) - _tail(bf16)) <= 0.1 * _tail(bf16) + 1e-3


@needs_fp8_gpu
def test_transformer_engine_fp8_training_matches_bf16():
    te = pytest.importorskip("transformer_engine.pytorch")

    def te_mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(te.Linear(256, 512), torch.nn.GELU(), te.Linear(512, 16))

    bf16 = _train("bf16-mixed", te_mlp())
    fp8 = _train(FP8Precision("transformer_engine"), te_mlp())
    assert _tail(fp8) < 0.5 * fp8[0]
    assert abs(_tail(fp8) - _tail(bf16)) <= 0.1 * _tail(bf16) + 1e-3
