"""Accelerator.save_state / load_state / register_for_checkpointing / save_model, and
load_checkpoint_in_model."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

import trainer
from tests.conftest import make_loader
from trainer import Accelerator, ProjectConfiguration, init_empty_weights, load_checkpoint_in_model
from trainer.checkpoint.manifest import allowing_extra_files


class Counter:
    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _setup(accelerator: Accelerator, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    return accelerator.prepare(model, optimizer, make_loader(n=16), scheduler)


def _train(accelerator, model, optimizer, loader, scheduler, steps):
    done = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        done += 1
        if done == steps:
            return


def test_save_state_then_load_state_continues_identically(tmp_path):
    accelerator = Accelerator(cpu=True)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    objects = _setup(accelerator)
    _train(accelerator, *objects, steps=3)
    counter.value = 5
    accelerator.save_state(tmp_path / "state")
    _train(accelerator, *objects, steps=2)
    expected = [p.detach().clone() for p in objects[0].parameters()]

    other = Accelerator(cpu=True)
    counter2 = Counter()
    other.register_for_checkpointing(counter2)
    restored = _setup(other, seed=123)
    other.load_state(tmp_path / "state")
    assert counter2.value == 5 and restored[3].get_last_lr() == pytest.approx([1e-2 * 0.5**3])
    _train(other, *restored, steps=2)
    for got, want in zip(restored[0].parameters(), expected, strict=True):
        assert torch.equal(got, want)


def test_automatic_naming_total_limit_and_newest_load(tmp_path):
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    for value in range(3):
        with torch.no_grad():
            model.weight.fill_(value)
        accelerator.save_state()
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["checkpoint_1", "checkpoint_2"]
    with torch.no_grad():
        model.weight.fill_(-1)
    assert accelerator.load_state().endswith("checkpoint_2")
    assert torch.all(model.weight == 2) and config.iteration == 3


def test_load_state_with_other_objects_prepared_is_refused(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.save_state(tmp_path / "s")
    other = Accelerator(cpu=True)
    other.prepare(
        torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    )
    with pytest.raises(trainer.CheckpointError, match="0 optimizer_states but 1 are prepared"):
        other.load_state(tmp_path / "s")
    with pytest.raises(trainer.ConfigurationError, match="give a directory"):
        Accelerator(cpu=True).save_state()


def test_load_state_options_accelerate_takes(tmp_path):
    """Accelerate's strict= / map_location= / load_kwargs: strict=False skips names the model
    or the checkpoint lacks; options nothing here could honour are refused, naming them."""
    accelerator = Accelerator(cpu=True)
    small = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    accelerator.save_state(tmp_path / "s")
    other = Accelerator(cpu=True)
    grown = other.prepare(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)))
    tail = grown[1].weight.detach().clone()
    with pytest.raises(trainer.CheckpointError, match="1.weight"):
        other.load_state(tmp_path / "s")
    other.load_state(tmp_path / "s", load_kwargs={"weights_only": True}, strict=False)
    assert torch.equal(grown[0].weight, small[0].weight) and torch.equal(grown[1].weight, tail)
    for map_location in (None, "cpu", "on_device"):
        other.load_state(tmp_path / "s", strict=False, map_location=map_location)
    with pytest.raises(trainer.ConfigurationError, match="map_location='cuda:1'"):
        other.load_state(tmp_path / "s", strict=False, map_location="cuda:1")
    with pytest.raises(trainer.ConfigurationError, match="assign"):
        other.load_state(tmp_path / "s", assign=True)
    with pytest.raises(trainer.ConfigurationError, match=r"load_kwargs\['pickle_module'\]"):
        other.load_state(tmp_path / "s", load_kwargs={"pickle_module": json})
    with pytest.raises(trainer.ConfigurationError, match="exclude_frozen_parameters"):
        other.save_state(tmp_path / "t", exclude_frozen_parameters=True)
    assert not (tmp_path / "t").exists()


def test_register_for_checkpointing_refuses_objects_without_state():
    with pytest.raises(
        trainer.ConfigurationError, match=r"no state_dict/load_state_dict: \['0: object'\]"
    ):
        Accelerator(cpu=True).register_for_checkpointing(object())


def test_save_model_single_and_sharded_then_load_checkpoint_in_model(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])  # ~16.6 KB per layer
    accelerator.save_model(model, tmp_path / "single")
    assert sorted(os.listdir(tmp_path / "single")) == ["model.safetensors"]
    accelerator.save_model(model, tmp_path / "sharded", max_shard_size="40KB")
    files = sorted(os.listdir(tmp_path / "sharded"))
    assert (
        "model.safetensors.index.json" in files
        and len([f for f in files if f.startswith("model-")]) == 2
    )
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    # Re-saving unsharded removes the stale shards.
    accelerator.save_model(model, tmp_path / "sharded")
    assert sorted(os.listdir(tmp_path / "sharded")) == ["model.safetensors"]
    accelerator.save_model(model, tmp_path / "sharded2", max_shard_size="40KB")
    for source in (
        tmp_path / "single",
        tmp_path / "sharded2",
        tmp_path / "sharded2" / "model.safetensors.index.json",
        tmp_path / "single" / "model.safetensors",
    ):
        with init_empty_weights():
            empty = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
        assert empty[0].weight.device.type == "meta"
        report = load_checkpoint_in_model(empty, source, strict=True)
        assert report == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
        for a, b in zip(empty.state_dict().values(), model.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    assert (
        load_file(str(tmp_path / "single" / "model.safetensors")).keys()
        == model.state_dict().keys()
    )


def test_load_checkpoint_in_model_reports_missing_unexpected_and_shape(tmp_path):
    torch.save({"0.weight": torch.zeros(3, 3), "extra": torch.zeros(1)}, tmp_path / "old.bin")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(
        trainer.CheckpointError,
        match=r"missing_keys: \['0.bias'\].*unexpected_keys: \['extra'\].*0.weight: checkpoint \(3, 3\) vs model \(2, 2\)",
    ):
        load_checkpoint_in_model(model, tmp_path / "old.bin", strict=True)
    with pytest.warns(UserWarning, match="missing_keys"):
        report = load_checkpoint_in_model(model, tmp_path / "old.bin")
    assert report["missing_keys"] == ["0.bias"]


def test_load_checkpoint_in_model_from_a_trainer_checkpoint_with_dtype(tmp_path):
    from trainer.checkpoint import write_checkpoint

    model = torch.nn.Linear(3, 3)
    write_checkpoint(tmp_path / "ck", {"state_dict": model.state_dict()})
    target = torch.nn.Linear(3, 3).to(torch.bfloat16)
    load_checkpoint_in_model(target, tmp_path / "ck", dtype="bfloat16")
    assert target.weight.dtype == torch.bfloat16 and torch.equal(
        target.weight, model.weight.to(torch.bfloat16)
    )


def test_init_empty_weights_builds_a_10b_parameter_model_without_memory():
    with init_empty_weights():
        big = torch.nn.Sequential(*[torch.nn.Linear(50_000, 50_000) for _ in range(4)])
    assert sum(p.numel() for p in big.parameters()) > 10**10
    assert all(p.device.type == "meta" for p in big.parameters())
    with trainer.init_on_device("cpu"):
        small = torch.nn.Linear(2, 2)
    assert small.weight.device.type == "cpu"


def _hooks(calls: list[str]):
    """diffusers' pair: the first model saved as a file of its own in extra/, read back."""
    from safetensors.torch import save_file

    def save_hook(models, weights, output_dir):
        calls.append("save")
        os.makedirs(os.path.join(output_dir, "net"))
        save_file(weights.pop(0), os.path.join(output_dir, "net", "weights.safetensors"))

    def load_hook(models, input_dir):
        calls.append("load")
        models.pop(0).load_state_dict(
            load_file(os.path.join(input_dir, "net", "weights.safetensors"))
        )

    return save_hook, load_hook


def _hooked_accelerator(calls: list[str]) -> tuple[Accelerator, tuple]:
    """An Accelerator with the save/load hook pair, and its prepared objects (`_setup`)."""
    accelerator = Accelerator(cpu=True)
    prepared = _setup(accelerator)
    save_hook, load_hook = _hooks(calls)
    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    return accelerator, prepared


def test_state_pre_hooks_files_join_the_checkpoint_listed_and_hashed(tmp_path):
    calls: list[str] = []
    accelerator, (model, optimizer, loader, scheduler) = _hooked_accelerator(calls)
    _train(accelerator, model, optimizer, loader, scheduler, 2)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    folder = accelerator.save_state(tmp_path / "ck")
    with allowing_extra_files():  # an Accelerator checkpoint's save-hook files
        manifest = trainer.checkpoint.verify_checkpoint(folder)
    assert "extra/net/weights.safetensors" in manifest["files"]
    with pytest.raises(trainer.CheckpointError, match="extra/net/weights.safetensors"):
        trainer.checkpoint.verify_checkpoint(folder)  # as a Trainer checkpoint: not its format
    assert load_file(os.path.join(folder, "model.safetensors")) == {}  # the hook saved it
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary folder left
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(folder)
    assert calls == ["save", "load"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_a_tampered_extra_file_is_refused_before_the_load_hook_reads_it(tmp_path):
    calls: list[str] = []
    accelerator, _ = _hooked_accelerator(calls)
    folder = accelerator.save_state(tmp_path / "ck")
    extra = os.path.join(folder, "extra", "net", "weights.safetensors")
    data = bytearray(open(extra, "rb").read())
    data[-1] ^= 0xFF
    open(extra, "wb").write(bytes(data))
    with pytest.raises(trainer.CheckpointError, match="extra/net/weights.safetensors"):
        accelerator.load_state(folder)
    assert calls == ["save"]  # the load hook never saw the altered file


def test_a_failing_save_hook_leaves_no_checkpoint_and_no_temporary_folder(tmp_path):
    accelerator = Accelerator(cpu=True)
    _setup(accelerator)

    def failing(models, weights, output_dir):
        open(os.path.join(output_dir, "half-written"), "w").write("x")
        raise RuntimeError("disk on fire")

    handle = accelerator.register_save_state_pre_hook(failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        accelerator.save_state(tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []
    handle.remove()
    folder = accelerator.save_state(tmp_path / "ck")  # the hook is gone: a plain checkpoint
    assert not os.path.exists(os.path.join(folder, "extra"))


def test_state_pre_hooks_with_background_saves(tmp_path):
    from trainer.plugins import AsyncCheckpointIO

    calls: list[str] = []
    accelerator, _ = _hooked_accelerator(calls)
    io = AsyncCheckpointIO()
    folder = accelerator.save_state(tmp_path / "ck", checkpoint_io=io)
    io.wait()
    with allowing_extra_files():
        assert (
            "extra/net/weights.safetensors" in trainer.checkpoint.verify_checkpoint(folder)["files"]
        )
    accelerator.load_state(folder)
    assert calls == ["save", "load"]


def test_save_model_is_atomic_and_keeps_the_other_files_of_the_folder(tmp_path):
    """A save that fails half-way (here: the second shard holds a dtype safetensors cannot
    store) leaves the previous save whole; a good one replaces the weights, keeps config.json."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    folder = tmp_path / "exported"
    accelerator.save_model(first, folder, max_shard_size="20KB")  # two shards and an index
    (folder / "config.json").write_text('{"layers": 2}')
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "vocab.txt").write_text("a b c")
    before = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors.index.json" in before

    broken = {k: torch.zeros_like(v) for k, v in first.state_dict().items()}  # other values
    broken["1.weight"] = torch.zeros(64, 64, dtype=torch.complex64)  # not a safetensors dtype
    from trainer.checkpoint.accelerator_state import save_model_weights

    with pytest.raises(ValueError, match="complex64"):
        save_model_weights(broken, folder, max_shard_size="20KB", safe_serialization=True)
    assert sorted(p.name for p in folder.iterdir()) == before
    restored = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    load_checkpoint_in_model(restored, folder, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(restored.parameters(), first.parameters()))

    second = torch.nn.Linear(2, 2)
    accelerator.save_model(second, folder)  # one file now: the shards and the index go
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer",
    ]
    assert (folder / "tokenizer" / "vocab.txt").read_text() == "a b c"
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no temporary folder left


def test_save_state_and_save_model_remove_what_a_killed_save_left(tmp_path):
    """A save_state / save_model killed mid-write leaves a hidden ``.<name>.tmp-<pid>-<host>-…``
    folder; only ModelCheckpoint removed such folders, so an Accelerator loop's project folder
    kept every one (a full model's weights each)."""
    import subprocess
    import sys

    from trainer.checkpoint.atomic import process_tag

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = process_tag().split("-", 1)[1].rsplit("-", 1)[0]
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = _setup(accelerator)[0]
    folders = {
        "state": tmp_path / "checkpoints",
        "model": tmp_path / "exported",
    }
    for folder in folders.values():
        folder.mkdir()
        for name in (
            f".checkpoint_0.tmp-{child.pid}-{host}-0123abcd",
            f".x.tmp-{os.getpid()}-{host}-0123abcd",
        ):
            (folder / name).mkdir()
            (folder / name / "model.safetensors").write_text("partial")
    accelerator.save_state()
    accelerator.save_model(model, folders["model"] / "weights")
    for folder in folders.values():
        hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
        assert hidden == [f".x.tmp-{os.getpid()}-{host}-0123abcd"], hidden  # a live writer's stays
