"""Accelerate's engine plugins and kwargs handlers on the Accelerator (one process, CPU).

The plugins map onto the existing strategies: the same settings from a launch file (through the
environment ``trainer launch`` sets), from a plugin, and from both together give the same
strategy. Each handler reaches the torch object it configures. The 2-process checks (DDP
options, the process group's timeout, one trace per process) are in
``tests/distributed/test_accelerator_handlers.py``.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from trainer import (
    Accelerator,
    AORecipeKwargs,
    AutocastKwargs,
    ConfigurationError,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    FullyShardedDataParallelPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    MegatronLMPlugin,
    ProfileKwargs,
    TorchDynamoPlugin,
)
from trainer.accelerator.engine_configs import model_parallel_fsdp_options
from trainer.accelerator.engine_setup import setup_engine
from trainer.accelerator.launch_config import load_launch_config
from trainer.accelerator.launchers import launch_environment
from trainer.strategies import STRATEGY_REGISTRY

FSDP_FILE = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: false
  fsdp_cpu_offload: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_activation_checkpointing: true
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: Block
mixed_precision: bf16
num_machines: 1
num_processes: 2
use_cpu: true
"""
FSDP_PLUGIN = dict(
    fsdp_version=2, reshard_after_forward=False, cpu_offload=False,
    auto_wrap_policy="transformer_based_wrap", cpu_ram_efficient_loading=True,
    activation_checkpointing=True, state_dict_type="FULL_STATE_DICT",
    transformer_cls_names_to_wrap=["Block"],
)  # fmt: skip
DEEPSPEED_FILE = """\
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 2
  gradient_clipping: 0.5
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 1
mixed_precision: bf16
num_processes: 2
use_cpu: true
"""
DEEPSPEED_PLUGIN = dict(
    gradient_accumulation_steps=2, gradient_clipping=0.5, offload_optimizer_device="cpu",
    offload_param_device="none", zero3_init_flag=False, zero_stage=1,
)  # fmt: skip
LAUNCH_VARIABLES = (
    "TRAINER_STRATEGY", "TRAINER_FSDP_CONFIG", "TRAINER_DEEPSPEED_CONFIG",
    "ACCELERATE_MIXED_PRECISION", "TRAINER_USE_CPU", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts outside `trainer launch` (the CI job may run under one)."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def launched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    """Set the variables `trainer launch --config_file` would set for this launch file."""
    path = tmp_path / "launch.yaml"
    path.write_text(text)
    for name, value in launch_environment(load_launch_config(path)).items():
        monkeypatch.setenv(name, value)


def fsdp_settings(strategy) -> tuple:
    return (
        type(strategy).__name__, strategy.reshard_after_forward, strategy.cpu_offload,
        strategy.auto_wrap_policy, strategy.state_dict_type, strategy.cpu_ram_efficient_loading,
        strategy.activation_checkpointing, strategy.precision.name,
    )  # fmt: skip


def built(**kwargs):
    """What ``Accelerator(cpu=True, **kwargs)`` resolves to, before any process group."""
    engine = setup_engine(kwargs.pop("strategy", None), cpu=True, **kwargs)
    engine.strategy.precision = engine.precision
    return engine


# ---- one strategy from the launch file, its environment and the plugin ---------------------
def test_fsdp_from_the_launch_file_the_plugin_or_both_is_one_strategy(monkeypatch, tmp_path):
    from_plugin = fsdp_settings(
        built(
            mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(**FSDP_PLUGIN)
        ).strategy
    )
    launched(monkeypatch, tmp_path, FSDP_FILE)
    from_file = fsdp_settings(built(mixed_precision=None).strategy)  # auto: TRAINER_STRATEGY=fsdp
    partial = FullyShardedDataParallelPlugin(
        state_dict_type="FULL_STATE_DICT"
    )  # file fills the rest
    both = fsdp_settings(built(mixed_precision=None, fsdp_plugin=partial).strategy)
    expected = ("FSDPStrategy", False, False, {"Block"}, "FULL", True, True, "bf16-mixed")
    assert from_file == from_plugin == both == expected


def test_the_plugins_fields_win_over_the_launch_file(monkeypatch, tmp_path):
    launched(monkeypatch, tmp_path, FSDP_FILE)
    plugin = FullyShardedDataParallelPlugin(reshard_after_forward=True, cpu_offload=True)
    strategy = built(mixed_precision=None, fsdp_plugin=plugin).strategy
    assert (strategy.reshard_after_forward, strategy.cpu_offload, strategy.state_dict_type) == (
        True, True, "FULL",
    )  # fmt: skip


def deepspeed_settings(engine) -> tuple:
    strategy = engine.strategy
    return (
        type(strategy).__name__, strategy.zero_stage, strategy.engine_config(micro_batch_size=4),
        engine.accumulation.num_steps, engine.precision.name,
    )  # fmt: skip


def test_deepspeed_from_the_launch_file_the_plugin_or_both_is_one_strategy(monkeypatch, tmp_path):
    pytest.importorskip("deepspeed")
    from_plugin = deepspeed_settings(
        built(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(**DEEPSPEED_PLUGIN))
    )
    launched(monkeypatch, tmp_path, DEEPSPEED_FILE)
    from_file = deepspeed_settings(built(mixed_precision=None))
    both = deepspeed_settings(
        built(mixed_precision=None, deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))
    )
    assert from_file == from_plugin == both
    _, stage, config, steps, precision = from_file
    assert (stage, steps, precision) == (1, 2, "bf16-mixed")
    assert config["gradient_clipping"] == 0.5 and config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_deepspeed_config_file_and_a_raw_deepspeed_section_still_work(monkeypatch, tmp_path):
    pytest.importorskip("deepspeed")
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(
        json.dumps({"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": "auto"})
    )
    plugin = DeepSpeedPlugin(hf_ds_config=str(ds_json), gradient_accumulation_steps=4)
    engine = built(mixed_precision="no", deepspeed_plugin=plugin)
    assert engine.strategy.zero_stage == 3 and engine.accumulation.num_steps == 4
    launched(
        monkeypatch,
        tmp_path,
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_optimization: {stage: 0}\n",
    )
    assert built(mixed_precision=None).strategy.zero_stage == 0


def test_megatron_plugin_is_megatron_strategy():
    pytest.importorskip("megatron.core")
    strategy = built(
        mixed_precision="no", megatron_lm_plugin=MegatronLMPlugin(tp_degree=2)
    ).strategy
    assert type(strategy).__name__ == "MegatronStrategy"
    assert (strategy.tensor_model_parallel_size, strategy.pipeline_model_parallel_size) == (2, 1)


def test_an_fsdp_plugin_shards_the_named_layers_and_trains(process_group):
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.tanh(self.linear(x))

    from torch.distributed.fsdp import FSDPModule

    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(4, 1))
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerator.fsdp_plugin is plugin
    assert [isinstance(m, FSDPModule) for m in (model, model[0], model[1], model[2])] == [
        True,
        True,
        True,
        False,
    ]
    accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
    optimizer.step()
    assert optimizer.step_count == 1


# ---- engine plugin options and their errors ------------------------------------------------
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: DeepSpeedPlugin(zero_stage=5), "expected 0, 1, 2 or 3"),
        (lambda: DeepSpeedPlugin(enable_msamp=True), "MS-AMP"),
        (lambda: FullyShardedDataParallelPlugin(fsdp_version=1), "FSDP2"),
        (lambda: FullyShardedDataParallelPlugin(forward_prefetch=True), "forward prefetch"),
        (lambda: FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["A"], transformer_layer_cls_to_wrap=["B"]), "Pass one"),
        (lambda: MegatronLMPlugin(num_micro_batches=4), "get_forward_backward_func"),
        (lambda: MegatronLMPlugin(gradient_clipping=1.0), "clip_grad_norm_"),
        (lambda: TorchDynamoPlugin(use_regional_compilation=True), "whole model"),
        (lambda: InitProcessGroupKwargs(init_method="tcp://1.2.3.4:5"), "launcher"),
        (lambda: FP8RecipeKwargs(backend="MSAMP"), "MS-AMP is not"),
    ],
)  # fmt: skip
def test_options_trainer_does_not_have_are_refused_with_the_fix(make, match):
    with pytest.raises(ConfigurationError, match=match):
        make()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(fsdp_plugin=FullyShardedDataParallelPlugin(), megatron_lm_plugin=MegatronLMPlugin()), "each choose the engine"),
        (dict(strategy="ddp", fsdp_plugin=FullyShardedDataParallelPlugin()), "each choose the engine"),
        (dict(dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin(backend="eager")), "not both"),
        (dict(kwargs_handlers=[object()]), "not a kwargs handler trainer knows"),
        (dict(kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()]), "two GradScalerKwargs"),
        (dict(kwargs_handlers=[AORecipeKwargs()]), "needs mixed_precision='fp8'"),
        (dict(strategy="single", parallelism_config="2x2"), "each choose the engine"),
        (dict(deepspeed_plugin={"a": DeepSpeedPlugin()}), "expected one DeepSpeedPlugin"),
        (dict(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy=print)), "class name or size"),
    ],
)  # fmt: skip
def test_conflicting_engine_arguments_are_refused(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        setup_engine(kwargs.pop("strategy", None), cpu=True, mixed_precision="no", **kwargs)


def test_deepspeed_accumulation_stated_twice_must_agree():
    pytest.importorskip("deepspeed")
    plugin = DeepSpeedPlugin(gradient_accumulation_steps=4)
    with pytest.raises(ConfigurationError, match="disagree. State it once"):
        setup_engine(
            None,
            cpu=True,
            mixed_precision="no",
            gradient_accumulation_steps=2,
            deepspeed_plugin=plugin,
        )


def test_dynamo_plugin_options_reach_torch_compile(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    plugin = TorchDynamoPlugin(
        backend="inductor", mode="max-autotune", fullgraph=True, dynamic=False
    )
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    accelerator.prepare(torch.nn.Linear(2, 2))
    assert calls == [
        {"backend": "inductor", "mode": "max-autotune", "fullgraph": True, "dynamic": False}
    ]
    assert accelerator.dynamo_backend == "inductor"
    assert Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin()).dynamo_plugin is None  # "no"


def test_parallelism_config_is_stored_and_chooses_the_strategy():
    from trainer.accelerator.parallelism import ParallelismConfig

    config = ParallelismConfig()
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    assert accelerator.parallelism_config is config
    assert type(accelerator.strategy).__name__ == "SingleDeviceStrategy"  # every size 1, 1 process
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="Block",
        reshard_after_forward=False, state_dict_type="FULL_STATE_DICT",
    )  # fmt: skip
    assert model_parallel_fsdp_options(plugin) == {
        "auto_wrap_policy": {"Block"}, "reshard_after_forward": False,
        "save_distributed_checkpoint": False,
    }  # fmt: skip
    with pytest.raises(ConfigurationError, match="no ModelParallelStrategy option"):
        model_parallel_fsdp_options(FullyShardedDataParallelPlugin(cpu_offload=True))
    handler = InitProcessGroupKwargs(backend="gloo")
    with pytest.raises(ConfigurationError, match="only replicates: that is DDP"):
        Accelerator(cpu=True, parallelism_config=config, kwargs_handlers=[handler])


# ---- kwargs handlers -----------------------------------------------------------------------
def test_accelerate_defaults_and_to_kwargs():
    assert InitProcessGroupKwargs().timeout == dt.timedelta(seconds=600)  # nccl's
    assert InitProcessGroupKwargs(backend="gloo").to_kwargs() == {
        "backend": "gloo", "timeout": dt.timedelta(seconds=1800),
    }  # fmt: skip
    assert DistributedDataParallelKwargs(comm_hook="fp16").to_kwargs() == {}  # the hook is separate
    assert GradScalerKwargs(init_scale=1024.0).to_kwargs() == {"init_scale": 1024.0}


def test_ddp_and_process_group_options_become_strategy_arguments():
    handlers = [
        DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=4, comm_hook="power_sgd",
                                      comm_state_option={"start_powerSGD_iter": 3}),
        InitProcessGroupKwargs(backend="gloo", timeout=dt.timedelta(seconds=77)),
    ]  # fmt: skip
    strategy = built(strategy="ddp", mixed_precision="no", kwargs_handlers=handlers).strategy
    assert strategy.ddp_kwargs["find_unused_parameters"] is True
    assert strategy.ddp_kwargs["bucket_cap_mb"] == 4
    assert strategy.ddp_comm_hook.__name__ == "powerSGD_hook"
    assert strategy.ddp_comm_state.start_powerSGD_iter == 3
    assert (strategy.process_group_backend, strategy.timeout) == ("gloo", dt.timedelta(seconds=77))
    # Engines without a DDP wrapper ignore DDP options, as in Accelerate; the group's they take.
    fsdp = built(strategy="fsdp", mixed_precision="no", kwargs_handlers=handlers).strategy
    assert fsdp.ddp_comm_hook is None and fsdp.timeout == dt.timedelta(seconds=77)
    single = built(strategy="single", mixed_precision="no", kwargs_handlers=handlers).strategy
    assert type(single).__name__ == "SingleDeviceStrategy"


def test_an_option_the_chosen_engine_lacks_is_refused(monkeypatch):
    def factory(*, find_unused_parameters: bool = False, accelerator: str | None = None):
        from trainer.strategies import SingleDeviceStrategy

        return SingleDeviceStrategy("cpu")

    monkeypatch.setitem(STRATEGY_REGISTRY, "partial_ddp", factory)
    handler = DistributedDataParallelKwargs(find_unused_parameters=True, static_graph=True)
    with pytest.raises(ConfigurationError, match="has no static_graph"):
        setup_engine("partial_ddp", cpu=True, mixed_precision="no", kwargs_handlers=[handler])
    strategy = Accelerator(cpu=True, strategy="single").strategy
    with pytest.raises(ConfigurationError, match="already built"):
        Accelerator(strategy=strategy, kwargs_handlers=[handler])


@pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning")
def test_ddp_kwargs_reach_distributed_data_parallel(process_group):
    handler = DistributedDataParallelKwargs(
        find_unused_parameters=True, bucket_cap_mb=1, gradient_as_bucket_view=True,
        static_graph=False, broadcast_buffers=False, comm_hook="fp16",
    )  # fmt: skip
    accelerator = Accelerator(cpu=True, strategy="ddp", kwargs_handlers=[handler])
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    assert type(model).__name__ == "DistributedDataParallel"
    assert (model.find_unused_parameters, model.bucket_bytes_cap, model.gradient_as_bucket_view) == (
        True, 1024 * 1024, True,
    )  # fmt: skip
    assert model.broadcast_buffers is False
    assert [hook.__name__ for hook, _ in model._comm_hooks] == ["fp16_compress_hook"]
    assert accelerator.ddp_handler is handler


def test_grad_scaler_kwargs_reach_the_scaler():
    handler = GradScalerKwargs(init_scale=8.0, growth_factor=4.0, growth_interval=1)
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[handler])
    model, optimizer = accelerator.prepare(*_model_and_optimizer())
    for _ in range(2):
        accelerator.backward(model(torch.ones(2, 4)).float().pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    assert accelerator.precision.scaler.get_scale() == 8.0 * 4 * 4  # grew after each good step
    assert accelerator.scaler_handler is handler


def test_autocast_kwargs_reach_autocast():
    model, _ = _model_and_optimizer()
    plain = Accelerator(cpu=True, mixed_precision="bf16")
    # returned in float32, as Accelerate's convert_outputs_to_fp32 (computed under autocast)
    assert plain.prepare(model)(torch.ones(1, 4)).dtype == torch.float32
    handler = AutocastKwargs(enabled=False)
    off = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[handler])
    assert off.prepare(_model_and_optimizer()[0])(torch.ones(1, 4)).dtype == torch.float32
    no_cache = Accelerator(
        cpu=True, mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(cache_enabled=False)]
    )
    with no_cache.autocast():
        assert torch.is_autocast_cache_enabled() is False
    with plain.autocast():
        assert torch.is_autocast_cache_enabled() is True


def test_autocast_with_a_handler_for_one_block_as_accelerate():
    hf = pytest.importorskip("accelerate")

    def seen(accelerator, handler_class) -> list:
        x = torch.ones(2, 2)
        facts = []
        for handler in (None, handler_class(enabled=False), handler_class(cache_enabled=False)):
            with accelerator.autocast(handler):
                facts.append(((x @ x).dtype, torch.is_autocast_cache_enabled()))
        return facts

    ours = seen(Accelerator(cpu=True, mixed_precision="bf16"), AutocastKwargs)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # Accelerate's process-wide singleton: another test's
    try:  # Accelerator may have fixed its mixed_precision in this worker
        theirs = seen(hf.Accelerator(cpu=True, mixed_precision="bf16"), hf.utils.AutocastKwargs)
    finally:
        AcceleratorState._reset_state(True)
    assert ours == theirs
    assert [dtype for dtype, _ in ours] == [torch.bfloat16, torch.float32, torch.bfloat16]
    assert ours[2][1] is False  # cache_enabled=False for that block only
    assert seen(Accelerator(cpu=True), AutocastKwargs)[1][0] == torch.float32  # fp32: no autocast


def test_profile_writes_a_trace_and_follows_the_schedule(tmp_path):
    handler = ProfileKwargs(
        output_trace_dir=str(tmp_path / "traces"), activities=["cpu"], record_shapes=True
    )
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    with accelerator.profile() as prof:
        model(torch.ones(3, 4))
    assert isinstance(prof, torch.profiler.profile)
    trace = json.loads((tmp_path / "traces" / "profile_0.json").read_text())
    linear = [e for e in trace["traceEvents"] if e.get("name") == "aten::linear"]
    assert linear and linear[0]["args"]["Input Dims"][0] == [3, 4]  # record_shapes reached it
    ready = []
    scheduled = ProfileKwargs(
        schedule_option={"wait": 1, "warmup": 1, "active": 1, "repeat": 1},
        on_trace_ready=ready.append,
    )
    with accelerator.profile(scheduled) as prof:  # the argument overrides the Accelerator's
        for _ in range(4):
            model(torch.ones(3, 4))
            prof.step()
    assert len(ready) == 1


def test_the_ao_recipe_reaches_the_fp8_precision_plugin():
    pytest.importorskip("torchao")
    from trainer.precision import FP8Precision

    handler = AORecipeKwargs(pad_inner_dim=False, module_filter_func=lambda layer, fqn: fqn != "1")
    precision = built(mixed_precision="fp8", kwargs_handlers=[handler]).precision
    assert isinstance(precision, FP8Precision) and precision.backend == "torchao"
    assert (precision.recipe.pad_inner_dim, precision.recipe.enable_fsdp_float8_all_gather) == (
        False,
        True,
    )
    precision.convert_module(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)))
    assert precision.converted_layers == ["0"]
    assert precision.skipped_layers == {"1": "module_filter_fn returned False"}
    if not torch.cuda.is_available():  # the Accelerator sets it up: fp8 needs an fp8 GPU
        with pytest.raises(ConfigurationError, match="needs an NVIDIA GPU"):
            Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[handler])


def test_the_te_recipe_reaches_the_fp8_precision_plugin(monkeypatch):
    recipe_module = types.ModuleType("transformer_engine.common.recipe")

    class Recipe:
        def __init__(self, **kwargs) -> None:
            self.kwargs = kwargs

    recipe_module.Recipe = Recipe
    recipe_module.DelayedScaling = type("DelayedScaling", (Recipe,), {})
    recipe_module.MXFP8BlockScaling = type("MXFP8BlockScaling", (Recipe,), {})
    recipe_module.Format = enum.Enum("Format", "HYBRID E4M3 E5M2")
    for name in ("transformer_engine", "transformer_engine.common", "transformer_engine.pytorch"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", recipe_module)
    handler = FP8RecipeKwargs(fp8_format="e4m3", margin=2, amax_history_len=16)
    precision = built(mixed_precision="fp8", kwargs_handlers=[handler]).precision
    assert precision.backend == "transformer_engine"
    assert type(precision.recipe).__name__ == "DelayedScaling"
    assert precision.recipe.kwargs == {
        "margin": 2, "fp8_format": recipe_module.Format.E4M3, "amax_history_len": 16,
    }  # fmt: skip


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)
