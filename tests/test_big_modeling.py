"""trainer.big_modeling: empty-weight init, device maps (exact bytes), dispatch, offload, loading.

Reference outputs come from the same model fully in memory; offloaded outputs must match to
atol 1e-6 in fp32. The disk-offload memory test runs in a subprocess with a 200 MB CPU budget
and ~600 MB of weights, and measures its peak RSS (VmHWM, mapped file pages included).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import trainer
from trainer import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from trainer.big_modeling.device_map import (
    balanced_memory,
    compute_module_sizes,
    find_tied_parameters,
)
from trainer.checkpoint.format import write_checkpoint, write_model_files
from trainer.errors import CheckpointError, ConfigurationError

REPO_ROOT = Path(__file__).resolve().parent.parent
LINEAR_100 = 100 * 100 * 4 + 100 * 4  # bytes of one fp32 nn.Linear(100, 100): 40,400


class Block(nn.Module):
    """A pre-norm residual MLP block: the unit a device map should not split."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding, blocks, a BatchNorm (float and int64 buffers) and a head tied to the embedding."""

    def __init__(self, vocab: int = 50, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.bn = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.bn(x.transpose(1, 2)).transpose(1, 2))


# TinyLM's bytes: embed 3,200 (head's weight is the same tensor), each block 4,416, bn 264.
TINY_TOTAL = 3_200 + 4 * 4_416 + 264


@pytest.fixture(scope="module")
def reference() -> tuple[TinyLM, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.num_batches_tracked.fill_(7)
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        return model, ids, model(ids)


def _empty_tiny() -> TinyLM:
    with init_empty_weights():
        return TinyLM().eval()


def _run(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


# --- init_empty_weights / init_on_device --------------------------------------------------------


_BUILD_10B = textwrap.dedent(
    """
    import json, sys, time, torch
    from torch import nn
    from trainer import init_empty_weights

    def rss():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return int(fields["VmRSS"].split()[0]) * 1024

    before = rss()
    start = time.perf_counter()
    with init_empty_weights():  # an LLM-shaped model: embedding, 48 MLP blocks, head
        model = nn.ModuleDict({
            "embed": nn.Embedding(32_000, 5_120),
            "blocks": nn.ModuleList(
                nn.Sequential(nn.LayerNorm(5_120), nn.Linear(5_120, 20_480), nn.GELU(),
                              nn.Linear(20_480, 5_120))
                for _ in range(48)
            ),
            "head": nn.Linear(5_120, 32_000, bias=False),
        })
    elapsed = time.perf_counter() - start
    print(json.dumps({
        "seconds": elapsed,
        "rss_growth": rss() - before,
        "parameters": sum(p.numel() for p in model.parameters()),
        "on_meta": all(p.is_meta for p in model.parameters()),
        "dynamo_imported": "torch._dynamo" in sys.modules,
    }))
    """
)


def test_init_empty_weights_builds_10b_parameters_in_well_under_a_second():
    # A fresh interpreter, so one-time costs (first meta op, lazy imports) are counted.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", _BUILD_10B], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    print(f"10B-parameter model on meta: {result['seconds'] * 1000:.1f} ms")
    assert result["parameters"] == 10_395_729_920 and result["on_meta"]
    assert not result["dynamo_imported"]  # nn.init on meta is skipped, not run through _refs
    assert result["seconds"] < 0.5, result
    assert result["rss_growth"] < 50 * 2**20, result  # 41.6 GB of fp32 weights, no memory
    with init_empty_weights():
        big = nn.Sequential(*[nn.Linear(50_000, 50_000) for _ in range(4)])
    assert sum(p.numel() for p in big.parameters()) == 10_000_200_000


def test_buffers_stay_real_unless_included_and_ties_made_in_init_survive():
    with init_empty_weights():
        norm = nn.BatchNorm1d(4)
    assert norm.weight.is_meta and norm.running_var.device.type == "cpu"
    assert torch.equal(norm.running_var, torch.ones(4))  # computed value kept
    with init_empty_weights(include_buffers=True):
        norm = nn.BatchNorm1d(4)
        huge = nn.Linear(100_000, 100_000)  # one 40 GB tensor: only possible created on meta
    assert norm.running_var.is_meta and huge.weight.is_meta
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"
    empty = _empty_tiny()
    assert empty.head.weight is empty.embed.weight  # tied in __init__, still one Parameter
    assert find_tied_parameters(empty) == [["embed.weight", "head.weight"]]


# --- infer_auto_device_map: exact byte arithmetic -------------------------------------------------


def _linears(n: int) -> nn.Sequential:
    with init_empty_weights():
        return nn.Sequential(*[nn.Linear(100, 100) for _ in range(n)])


def test_fill_keeps_the_largest_layer_in_reserve_on_the_cpu():
    net = _linears(4)
    assert compute_module_sizes(net)[""] == 4 * LINEAR_100
    # 3 layers of budget: one is held back for the offloaded layer being brought in.
    assert infer_auto_device_map(net, {"cpu": 3 * LINEAR_100}) == {
        "0": "cpu", "1": "cpu", "2": "disk", "3": "disk",
    }  # fmt: skip
    # One byte less: the second layer no longer fits beside the reserve.
    assert infer_auto_device_map(net, {"cpu": 3 * LINEAR_100 - 1}) == {
        "0": "cpu", "1": "disk", "2": "disk", "3": "disk",
    }  # fmt: skip
    # The last layer needs no reserve: nothing comes after it.
    assert infer_auto_device_map(net, {"cpu": 4 * LINEAR_100}) == {"": "cpu"}
    assert infer_auto_device_map(net, {"cpu": "161.6KB"}) == {"": "cpu"}
    assert infer_auto_device_map(net, {"cpu": 0}) == {"": "disk"}


def test_fill_goes_gpu_by_gpu_then_cpu_then_disk_with_reserves_on_main_devices():
    net = _linears(5)
    device_map = infer_auto_device_map(
        net, {"cpu": 2 * LINEAR_100, "cuda:1": LINEAR_100, 0: 2 * LINEAR_100}
    )
    # GPU 0 keeps one layer in reserve, GPU 1 does not, the CPU does (until the last layer).
    assert device_map == {"0": 0, "1": 1, "2": "cpu", "3": "disk", "4": "disk"}


def test_no_split_module_classes_keeps_blocks_whole():
    with init_empty_weights():
        pair = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 100))
        net = nn.Sequential(pair, copy.deepcopy(pair), nn.Linear(100, 100))
    budget = {"cpu": 170_000}
    # Split: reserve 40,400 (a Linear); 0 (80,800) and 1.0 fit in 129,600, 1.1 does not.
    assert infer_auto_device_map(net, budget) == {
        "0": "cpu",
        "1.0": "cpu",
        "1.1": "disk",
        "2": "disk",
    }
    # Kept whole: the reserve is a whole Sequential (80,800); block 1 goes to disk entire.
    assert infer_auto_device_map(net, budget, no_split_module_classes=["Sequential"]) == {
        "0": "cpu", "1": "disk", "2": "disk",
    }  # fmt: skip


def test_dtype_and_buffers_change_the_sizes():
    net = _linears(4)
    assert compute_module_sizes(net, dtype=torch.float16)[""] == 2 * LINEAR_100
    assert infer_auto_device_map(net, {"cpu": 3 * LINEAR_100}, dtype="float16") == {"": "cpu"}
    norm = nn.BatchNorm1d(10)  # weight, bias, running_mean, running_var: 40 B each; int64 counter
    assert compute_module_sizes(norm)[""] == 4 * 40 + 8
    assert compute_module_sizes(norm, dtype=torch.bfloat16)[""] == 4 * 20 + 8  # ints never cast
    net = _linears(3)
    assert infer_auto_device_map(net, {"cpu": 3 * LINEAR_100}) == {"": "cpu"}
    net[1].register_buffer("table", torch.zeros(100))  # +400 B: layer 1 no longer fits
    assert infer_auto_device_map(net, {"cpu": 3 * LINEAR_100}) == {
        "0": "cpu", "1": "disk", "2": "disk",
    }  # fmt: skip


def test_tied_weights_count_once_and_travel_together():
    with init_empty_weights():
        net = nn.Sequential(*[nn.Linear(100, 100) for _ in range(4)])
    net[3].weight = net[0].weight  # the head shares the first layer's weight; its bias is 400 B
    sizes = compute_module_sizes(net)
    assert (sizes["0"], sizes["3"], sizes[""]) == (LINEAR_100, 400, 3 * LINEAR_100 + 400)
    # 0 and 3 go together (40,800 B, the weight once) beside the 40,400 B reserve.
    budget = LINEAR_100 + 400 + LINEAR_100
    assert infer_auto_device_map(net, {"cpu": budget}) == {
        "0": "cpu", "3": "cpu", "1": "disk", "2": "disk",
    }  # fmt: skip
    assert infer_auto_device_map(net, {"cpu": budget - 1}) == {"": "disk"}


def test_balanced_maps_spread_over_gpus():
    sizes = {"": 1_000}
    memory = {0: 800, 1: 800, 2: 800, "cpu": 5_000}
    # ceil(1000 / 3) + the largest layer (100) on every GPU but the last.
    assert balanced_memory(memory, sizes, 100) == {0: 434, 1: 434, 2: 800, "cpu": 5_000}
    # balanced_low_0: GPU 0 only gets what GPUs 1 and 2 cannot hold.
    assert balanced_memory(memory, sizes, 100, low_zero=True) == {
        0: 0,
        1: 600,
        2: 800,
        "cpu": 5_000,
    }
    assert balanced_memory({0: 800, "cpu": 5}, sizes, 100) == {0: 800, "cpu": 5}


def test_max_memory_errors_name_the_key_and_the_fix():
    net = _linears(2)
    with pytest.raises(ConfigurationError, match=r"'gpu' .*not a device.*'cuda:0'"):
        infer_auto_device_map(net, {"gpu": 10})
    with pytest.raises(ConfigurationError, match=r"max_memory\['cpu'\]='lots'.*'10GiB'"):
        infer_auto_device_map(net, {"cpu": "lots"})
    with pytest.raises(ConfigurationError, match="expected class names"):
        infer_auto_device_map(net, {"cpu": 1}, no_split_module_classes=[3])
    assert infer_auto_device_map(net) in ({"": "cpu"}, {"": 0})  # None: what the machine has free


# --- dispatch and offload hooks -------------------------------------------------------------------


def test_dispatch_model_streams_disk_modules_just_in_time(reference, tmp_path):
    model, ids, want = reference
    net = copy.deepcopy(model)
    device_map = {"embed": "cpu", "head": "cpu", "blocks.0": "cpu", "blocks.1": "disk",
                  "blocks.2": "disk", "blocks.3": "cpu", "bn": "disk"}  # fmt: skip
    dispatch_model(net, device_map, offload_dir=tmp_path)
    seen = []
    net.blocks[1].fc1.register_forward_hook(
        lambda m, i, o: seen.append(m.weight.device.type), prepend=True
    )
    assert torch.allclose(_run(net, ids), want, atol=1e-6, rtol=0)
    assert seen == ["cpu"] and net.blocks[1].fc1.weight.is_meta  # in during forward, out after
    assert net.bn.running_var.device.type == "cpu"  # buffers stay with the computation
    assert net.head.weight is net.embed.weight and net.hf_device_map == device_map
    index = json.loads((tmp_path / "index.json").read_text())
    assert set(index) == {
        f"blocks.{i}.{p}" for i in (1, 2) for p in
        ("norm.weight", "norm.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    } | {"bn.weight", "bn.bias"}  # fmt: skip
    assert torch.allclose(_run(net, ids), want, atol=1e-6, rtol=0)  # and again


def test_cpu_offload_and_disk_offload_match_the_model_in_memory(reference, tmp_path):
    model, ids, want = reference
    net = cpu_offload(copy.deepcopy(model))
    assert net.blocks[0].fc1.weight.is_meta and net.bn.running_mean.device.type == "cpu"
    assert torch.allclose(_run(net, ids), want, atol=1e-6, rtol=0)
    net = disk_offload(copy.deepcopy(model), tmp_path / "off", offload_buffers=True)
    assert net.embed.weight.is_meta and net.bn.running_mean.is_meta
    assert (tmp_path / "off" / "blocks.3.fc2.weight.safetensors").is_file()
    assert torch.allclose(_run(net, ids), want, atol=1e-6, rtol=0)
    # A meta model streams from an existing offload folder.
    empty = disk_offload(_empty_tiny(), tmp_path / "off", offload_buffers=True)
    assert torch.allclose(_run(empty, ids), want, atol=1e-6, rtol=0)


class Head(nn.Module):
    """Uses its child's weight directly, outside the child's forward (hooks never see it)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.proj.weight)


def test_preload_module_classes_loads_a_whole_subtree(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Head())
    x = torch.randn(2, 4)
    want = model(x)
    device_map = {"0": "cpu", "1": "disk"}
    # Without preload_module_classes, Head would read proj.weight as a meta placeholder (torch
    # then returns uninitialised memory for F.linear(cpu, meta): wrong, silently).
    fixed = dispatch_model(copy.deepcopy(model), device_map, offload_dir=tmp_path / "b",
                           preload_module_classes=["Head"])  # fmt: skip
    assert torch.allclose(fixed(x), want, atol=1e-6, rtol=0) and fixed[1].proj.weight.is_meta
    # When the output itself is left on meta, the root hook says what to do.
    weights_out = nn.Sequential(nn.Linear(4, 4))
    weights_out.forward = lambda x: weights_out[0].weight.sum(0)  # type: ignore[method-assign]
    dispatch_model(weights_out, {"": "disk"}, offload_dir=tmp_path / "c")
    with pytest.raises(ConfigurationError, match=r"meta device.*preload_module_classes"):
        weights_out(x)


def test_cpu_offload_with_hook_offloads_the_previous_model():
    torch.manual_seed(0)
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    x = torch.randn(2, 3)
    want = second(first(x))
    first, hook1 = cpu_offload_with_hook(first)
    second, hook2 = cpu_offload_with_hook(second, prev_module_hook=hook1)
    calls = []
    hook1.offload = lambda: calls.append("first offloaded")  # type: ignore[method-assign]
    # The execution device is the GPU when there is one (Accelerate's default): outputs are there.
    torch.testing.assert_close(second(first(x)).cpu(), want)  # CUDA's matmul: not bit-equal
    assert calls == ["first offloaded"]
    hook2.remove()
    second(x.to(second.weight.device))  # removed: the layer stays where it last ran
    assert calls == ["first offloaded"] and isinstance(
        hook2, trainer.big_modeling.UserCpuOffloadHook
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU as execution device")
def test_offloaded_weights_run_on_the_gpu_and_outputs_come_back(reference, tmp_path):
    model, ids, want = reference
    net = dispatch_model(copy.deepcopy(model), {"embed": 0, "head": 0, "blocks": "cpu", "bn": "disk"},
                         offload_dir=tmp_path)  # fmt: skip
    assert net.blocks[0].fc1.weight.is_meta and net.embed.weight.device.type == "cuda"
    got = _run(net, ids)
    assert got.device.type == "cpu" and torch.allclose(got, want, atol=1e-5)
    encoder, hook = cpu_offload_with_hook(nn.Linear(2, 2))
    encoder(torch.ones(1, 2))
    assert encoder.weight.device.type == "cuda"
    hook.offload()
    assert encoder.weight.device.type == "cpu"


def test_dispatch_errors_name_the_fix(reference, tmp_path):
    model, _, _ = reference
    with pytest.raises(ConfigurationError, match=r"\['blocks'\] to 'disk' but offload_dir is None"):
        dispatch_model(copy.deepcopy(model), {"": "cpu", "blocks": "disk"})
    with pytest.raises(
        ConfigurationError, match=r"no device to 2 tensors: bn.weight, bn.bias.*'auto'"
    ):
        dispatch_model(copy.deepcopy(model), {"embed": "cpu", "blocks": "cpu", "head": "cpu",
                                              "bn.running_mean": "cpu", "bn.running_var": "cpu",
                                              "bn.num_batches_tracked": "cpu"})  # fmt: skip
    with pytest.raises(
        ConfigurationError, match="still on the meta device.*load_checkpoint_in_model"
    ):
        dispatch_model(_empty_tiny(), {"": "cpu"})
    with pytest.raises(ConfigurationError, match="no weights for .* offloaded tensors"):
        dispatch_model(_empty_tiny(), {"": "cpu", "blocks": "disk"}, offload_dir=tmp_path)
    disk_offload(nn.Linear(3, 3), tmp_path / "other")
    with pytest.raises(
        ConfigurationError,
        match=r"holds 'weight' as float32 \[3, 3\].*\[2, 2\].*empty offload folder",
    ):
        disk_offload(nn.Linear(2, 2), tmp_path / "other")
    with pytest.raises(ConfigurationError, match="expected a dict or one of 'auto'"):
        load_checkpoint_and_dispatch(_empty_tiny(), tmp_path, device_map="everywhere")


# --- loading checkpoints into empty models --------------------------------------------------------


def _sources(model: nn.Module, root: Path) -> dict[str, Path]:
    state = model.state_dict()
    for name in ("single", "sharded"):
        (root / name).mkdir()
    write_model_files(root / "single", state)
    write_model_files(root / "sharded", state, max_shard_size=4_000)  # 9 shards + index
    write_checkpoint(root / "checkpoint", {"state_dict": state, "epoch": 1})
    torch.save({k: v.clone() for k, v in state.items()}, root / "legacy.bin")
    return {
        "safetensors file": root / "single" / "model.safetensors",
        "sharded index": root / "sharded" / "model.safetensors.index.json",
        "sharded directory": root / "sharded",
        "checkpoint directory": root / "checkpoint",
        "legacy .bin": root / "legacy.bin",
    }


def test_load_checkpoint_and_dispatch_from_every_format(reference, tmp_path):
    model, ids, want = reference
    sources = _sources(model, tmp_path)
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) == 9
    for label, source in sources.items():
        offload = tmp_path / f"offload-{label.replace(' ', '-')}"
        net = load_checkpoint_and_dispatch(
            _empty_tiny(), source, device_map="auto", max_memory={"cpu": 12_000},
            no_split_module_classes=["Block"], offload_folder=offload, strict=True,
        )  # fmt: skip
        assert net.hf_device_map == {"embed": "cpu", "head": "cpu", "bn": "disk", "blocks": "disk"}
        assert torch.allclose(_run(net, ids), want, atol=1e-6, rtol=0), label
        assert net.head.weight is net.embed.weight, label
        entry = json.loads((offload / "index.json").read_text())["blocks.0.fc1.weight"]
        if label == "legacy .bin":  # a pickle cannot be mapped: the tensor was written out
            assert entry["file"] == "blocks.0.fc1.weight.safetensors"
        else:  # safetensors are read where they are: no copy in the offload folder
            directory = source.parent if source.is_file() else source
            assert Path(entry["file"]).parent == directory.resolve()
            assert list(offload.iterdir()) == [offload / "index.json"]


def test_load_checkpoint_in_model_with_a_device_map_and_dtype(reference, tmp_path):
    model, ids, _ = reference
    sources = _sources(model, tmp_path)
    net = _empty_tiny()
    device_map = {"embed": "cpu", "head": "cpu", "blocks": "disk", "bn": "cpu"}
    report = load_checkpoint_in_model(
        net, sources["sharded index"], device_map, tmp_path / "off", dtype=torch.bfloat16
    )
    assert report == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    assert net.embed.weight.dtype == torch.bfloat16 and net.blocks[0].fc1.weight.is_meta
    assert net.bn.num_batches_tracked.dtype == torch.int64 and int(net.bn.num_batches_tracked) == 7
    assert (tmp_path / "off" / "blocks.0.fc1.weight.safetensors").is_file()  # cast, so copied
    dispatch_model(net, device_map, offload_dir=tmp_path / "off")
    expected = copy.deepcopy(model).to(torch.bfloat16)
    assert torch.equal(_run(net, ids), _run(expected, ids))


def test_missing_unexpected_and_mismatched_keys_are_reported(reference, tmp_path):
    model, _, _ = reference
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.3.fc2")}
    state["blocks.0.fc1.bias"] = torch.zeros(5)
    state["extra.weight"] = torch.zeros(1)
    del state["head.weight"]  # tied to embed.weight: not missing
    save_file(state, tmp_path / "partial.safetensors")
    device_map = {"": "cpu", "blocks.3": "disk"}
    with pytest.raises(
        CheckpointError,
        match=r"missing_keys: \['blocks.3.fc2.bias', 'blocks.3.fc2.weight'\]; "
        r"unexpected_keys: \['extra.weight'\]; mismatched_keys: "
        r"\['blocks.0.fc1.bias: checkpoint \(5,\) vs model \(32,\)'\].*strict=False",
    ):
        load_checkpoint_in_model(_empty_tiny(), tmp_path / "partial.safetensors", device_map,
                                 tmp_path / "off", strict=True)  # fmt: skip
    net = _empty_tiny()
    with pytest.warns(UserWarning, match="missing_keys"):
        report = load_checkpoint_in_model(net, tmp_path / "partial.safetensors", device_map,
                                          tmp_path / "off")  # fmt: skip
    assert report["missing_keys"] == ["blocks.3.fc2.bias", "blocks.3.fc2.weight"]
    assert net.head.weight is net.embed.weight and not net.head.weight.is_meta
    with pytest.raises(ConfigurationError, match="pass offload_folder="):
        load_checkpoint_in_model(_empty_tiny(), tmp_path / "partial.safetensors", device_map)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
        load_checkpoint_in_model(_empty_tiny(), tmp_path / "bad.safetensors")


def test_a_checkpoint_directory_is_verified_before_any_weight_is_placed(reference, tmp_path):
    """A flipped byte in a trainer checkpoint is refused before the model or the offload folder
    changes, whether the folder or one of its files is given; an honest copy loads."""
    model, ids, want = reference
    folder = write_checkpoint(
        tmp_path / "ck", {"state_dict": model.state_dict(), "epoch": 0}, max_shard_size=4_000
    )
    shard = folder / "model-00002-of-00009.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01
    shard.write_bytes(bytes(data))
    for source in (folder, folder / "model.safetensors.index.json", shard):
        net = _empty_tiny()
        with pytest.raises(
            CheckpointError, match=r"model-00002-of-00009\.safetensors does not match"
        ):
            load_checkpoint_and_dispatch(
                net, source, device_map="auto", max_memory={"cpu": 12_000},
                no_split_module_classes=["Block"], offload_folder=tmp_path / "off",
            )  # fmt: skip
        assert all(p.is_meta for p in net.parameters()), source
        assert not (tmp_path / "off").exists(), source
    data[-3] ^= 0x01
    shard.write_bytes(bytes(data))
    net = load_checkpoint_and_dispatch(
        _empty_tiny(), folder, device_map="auto", max_memory={"cpu": 12_000},
        no_split_module_classes=["Block"], offload_folder=tmp_path / "off", strict=True,
    )  # fmt: skip
    assert torch.allclose(_run(net, ids), want, atol=1e-6, rtol=0)


def test_an_index_without_a_manifest_names_only_files_inside_its_folder(reference, tmp_path):
    """A Hugging Face style folder (no manifest): each weight_map entry is confined, by name."""
    model, _, _ = reference
    folder = tmp_path / "hf"
    folder.mkdir()
    write_model_files(folder, model.state_dict(), max_shard_size=4_000)
    index_path = folder / "model.safetensors.index.json"
    honest = json.loads(index_path.read_text())
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((folder / "model-00001-of-00009.safetensors").read_bytes())
    for value, reason in (
        (str(outside), "is absolute"),
        ("../elsewhere.safetensors", "leaves the folder"),
        ("model-00010-of-00009.safetensors", "does not exist"),
        (7, "expected a non-empty relative path"),
    ):
        index = copy.deepcopy(honest)
        index["weight_map"]["embed.weight"] = value
        index_path.write_text(json.dumps(index))
        net = _empty_tiny()
        with pytest.raises(CheckpointError, match=rf"field 'weight_map\.embed\.weight'.*{reason}"):
            load_checkpoint_in_model(net, folder)
        assert all(p.is_meta for p in net.parameters()), value
    index = copy.deepcopy(honest)
    index["metadata"]["aliases"] = ["head.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"field 'metadata\.aliases'"):
        load_checkpoint_in_model(_empty_tiny(), index_path)


@pytest.mark.parametrize(
    ("aliases", "match"),
    [
        ('{"a": "b"', r"'__metadata__\.aliases': expected a JSON object"),  # a JSONDecodeError
        ('["weight"]', r"'__metadata__\.aliases': expected a mapping"),  # an AttributeError
        ("[" * 100_000 + "]" * 100_000, r"'__metadata__\.aliases': expected a JSON object"),
    ],
    ids=["not-json", "a-list", "nested"],
)
def test_a_safetensors_file_with_bad_aliases_metadata_is_refused(
    tmp_path: Path, aliases: str, match: str
) -> None:
    path = tmp_path / "model.safetensors"
    save_file(nn.Linear(4, 1).state_dict(), path, metadata={"aliases": aliases})
    with pytest.raises(CheckpointError, match=rf"model\.safetensors, field {match}"):
        load_checkpoint_in_model(nn.Linear(4, 1), path)


def test_a_safetensors_file_with_metadata_that_is_not_strings_is_refused(tmp_path: Path) -> None:
    raw = b'{"__metadata__":{"aliases":{"a":"b"}},"bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(4))  # a TypeError in json before
    with pytest.raises(CheckpointError, match="'__metadata__' must map names to strings"):
        load_checkpoint_in_model(nn.Linear(4, 1), path)


# --- a model bigger than its memory budget, in a subprocess ---------------------------------------

_BUDGET = 200 * 10**6  # max_memory={"cpu": "200MB"}
_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from safetensors.torch import load_file
    from trainer import init_empty_weights, load_checkpoint_and_dispatch

    def rss():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {k: int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS", "RssFile")}

    sys.path.insert(0, sys.argv[1])
    from big_net import make
    imported = rss()
    with init_empty_weights():
        model = make()
    model = load_checkpoint_and_dispatch(
        model, sys.argv[2], device_map="auto", max_memory={"cpu": "200MB"}, offload_folder=sys.argv[3]
    )
    loaded = rss()
    io = load_file(sys.argv[4])
    with torch.no_grad():
        out = model(io["x"])
    print(json.dumps({
        "imported": imported, "loaded": loaded, "end": rss(), "map": model.hf_device_map,
        "max_abs_diff": float((out - io["y"]).abs().max()),
        "resident": sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta),
    }))
    """
)
_NET = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            return x + torch.tanh(self.fc(x))

    def make(width=2048, depth=36):  # 36 x 16.8 MB = 604 MB of fp32 weights
        return nn.Sequential(*[Residual(width) for _ in range(depth)])
    """
)


@pytest.mark.slow
def test_disk_offload_under_a_cpu_budget_keeps_peak_rss_bounded(tmp_path):
    (tmp_path / "big_net.py").write_text(_NET)
    sys.path.insert(0, str(tmp_path))
    try:
        from big_net import make  # type: ignore[import-not-found]  # written just above
    finally:
        sys.path.remove(str(tmp_path))
    torch.manual_seed(0)
    model = make()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weights > 3 * _BUDGET
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    state = model.state_dict()
    weight_map = {}
    for shard, start in enumerate(range(0, 36, 6)):  # 6 shards of ~100 MB, HF-style index
        names = [n for n in state if start <= int(n.split(".")[0]) < start + 6]
        save_file({n: state[n] for n in names}, checkpoint / f"shard-{shard}.safetensors")
        weight_map.update(dict.fromkeys(names, f"shard-{shard}.safetensors"))
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    x = torch.randn(4, 2048)
    with torch.no_grad():
        save_file({"x": x, "y": model(x)}, tmp_path / "io.safetensors")
    del model, state

    # glibc's dynamic mmap threshold would keep freed 16 MB blocks in the heap and inflate RSS:
    # pin it at 1 MiB so RSS reflects live memory.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576", "PYTHONPATH": str(REPO_ROOT)}
    args = [
        str(tmp_path),
        str(checkpoint),
        str(tmp_path / "offload"),
        str(tmp_path / "io.safetensors"),
    ]
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    print({k: v for k, v in result.items() if k != "map"})
    assert result["max_abs_diff"] <= 1e-6
    assert "disk" in result["map"].values() and result["resident"] <= _BUDGET
    peak = result["end"]["VmHWM"]
    # Beyond the imports (~0.3 GB with a CPU torch, ~0.5 GB with CUDA's libraries), the model
    # itself stayed within its budget (mapped pages included).
    assert peak - result["imported"]["VmRSS"] < _BUDGET + 25 * 10**6


@pytest.mark.parametrize("text", ["[" * 100_000, "{not json", "[1, 2]"])
def test_an_unreadable_offload_index_is_refused(tmp_path, text):
    from trainer.big_modeling.offload_folder import OFFLOAD_INDEX, load_offload_index

    (tmp_path / OFFLOAD_INDEX).write_text(text)
    with pytest.raises(CheckpointError, match="offload index .* is unreadable"):
        load_offload_index(tmp_path)
