"""trainer/checkpoint/sharded.py: DCP shards inside the atomic directory, saved and loaded for real.

One process joins a gloo group of world size 1, so FSDP2 shards over a 1-rank mesh and
``torch.distributed.checkpoint`` writes real shard files; the multi-rank runs are in
tests/distributed/test_fsdp.py and test_megatron.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from trainer.checkpoint import verify_checkpoint
from trainer.checkpoint.sharded import (
    DCP_DIR,
    has_sharded_state,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)
from trainer.errors import CheckpointError
from trainer.strategies.fsdp import FSDPStrategy


@pytest.fixture
def strategy(tmp_path: Path) -> Iterator[FSDPStrategy]:
    """An FSDPStrategy on CPU in a 1-process gloo group, torn down after the test."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        strategy = FSDPStrategy("cpu")
        strategy.setup_environment()  # reuses the group, builds the 1-D mesh
        yield strategy
    finally:
        dist.destroy_process_group()


def _prepare(strategy: FSDPStrategy) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = strategy.setup_module(model)
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _full(strategy: FSDPStrategy, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in strategy.module_state_dict(model, full=True).items()}


def test_save_then_load_restores_model_optimizer_and_json_state(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    model, optimizer = _prepare(strategy)
    _step(model, optimizer)
    path = tmp_path / "checkpoints" / "step=1"
    checkpoint = {
        "state_dict": strategy.module_state_dict(model, full=False),
        "optimizer_states": [strategy.optimizer_state_dict(optimizer)],
        "epoch": 0,
        "global_step": 1,
    }
    save_sharded_checkpoint(strategy, path, checkpoint)
    saved = _full(strategy, model)
    saved_step = strategy.optimizer_state_dict(optimizer)["state"]["0.weight"]["step"].clone()

    assert set(checkpoint) == {"state_dict", "optimizer_states", "epoch", "global_step"}
    assert has_sharded_state(path)
    assert any((path / DCP_DIR).glob("*.distcp"))  # real DCP shard files
    assert not (path / "model.safetensors").exists()  # the tensors live in the shards only
    manifest = verify_checkpoint(path)  # the manifest covers the shards too
    assert any(name.startswith(f"{DCP_DIR}/") for name in manifest["files"])
    assert manifest["global_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["step=1"]  # no staging folder left

    _step(model, optimizer)
    assert not torch.equal(_full(strategy, model)["0.weight"], saved["0.weight"])

    loaded = load_sharded_checkpoint(strategy, path, model, [optimizer])
    strategy.load_module_state_dict(model, loaded["state_dict"])
    strategy.load_optimizer_state_dict(optimizer, loaded["optimizer_states"][0])

    assert (loaded["epoch"], loaded["global_step"]) == (0, 1)
    restored = _full(strategy, model)
    assert restored.keys() == saved.keys()
    for key, value in saved.items():
        torch.testing.assert_close(restored[key], value, rtol=0, atol=0)
    step = strategy.optimizer_state_dict(optimizer)["state"]["0.weight"]["step"]
    torch.testing.assert_close(step, saved_step, rtol=0, atol=0)


def test_save_replaces_an_existing_checkpoint(strategy: FSDPStrategy, tmp_path: Path) -> None:
    model, optimizer = _prepare(strategy)
    path = tmp_path / "last"
    for step in (1, 2):
        _step(model, optimizer)
        state = {"state_dict": strategy.module_state_dict(model, full=False), "global_step": step}
        save_sharded_checkpoint(strategy, path, state)
    expected = _full(strategy, model)
    _step(model, optimizer)

    loaded = load_sharded_checkpoint(strategy, path, model, [])
    strategy.load_module_state_dict(model, loaded["state_dict"])

    assert loaded["global_step"] == 2
    assert loaded["optimizer_states"] == []
    assert [p.name for p in tmp_path.iterdir() if p.name != "store"] == ["last"]
    torch.testing.assert_close(_full(strategy, model), expected, rtol=0, atol=0)


def test_load_without_a_prepared_model_names_the_fix(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    model, optimizer = _prepare(strategy)
    path = tmp_path / "ckpt"
    save_sharded_checkpoint(
        strategy, path, {"state_dict": strategy.module_state_dict(model, full=False)}
    )

    with pytest.raises(CheckpointError, match="prepare it first"):
        load_sharded_checkpoint(strategy, path, None, [optimizer])


def test_has_sharded_state_is_false_for_a_full_checkpoint(tmp_path: Path) -> None:
    from trainer.checkpoint import write_checkpoint

    write_checkpoint(tmp_path / "full", {"state_dict": {"w": torch.ones(2)}})

    assert not has_sharded_state(tmp_path / "full")
    assert not has_sharded_state(tmp_path / "missing")


def test_a_folder_that_is_not_a_checkpoint_is_refused_before_any_shard_is_written(
    strategy: FSDPStrategy, tmp_path: Path
) -> None:
    model, _ = _prepare(strategy)
    other = tmp_path / "state"
    other.mkdir()
    (other / "optimizer.bin").write_bytes(b"user data")
    checkpoint = {"state_dict": strategy.module_state_dict(model, full=False), "global_step": 0}

    with pytest.raises(CheckpointError, match="not a checkpoint"):
        save_sharded_checkpoint(strategy, other, checkpoint)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["state", "store"]  # no staging folder
    assert (other / "optimizer.bin").read_bytes() == b"user data"
