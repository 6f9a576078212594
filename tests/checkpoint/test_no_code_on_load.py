"""No code runs when any checkpoint is loaded, even one whose manifest was re-hashed.

Each test writes a real checkpoint (DCP shards from the FSDP path, DeepSpeed's engine files, an
Accelerate ``save_state`` folder, a Lightning ``.ckpt``, a legacy ``.pt``), puts a pickle whose
``__reduce__`` would create a marker folder (or run ``touch`` through ``os.system``) into one of
its files, re-hashes the manifest so the integrity check passes, and loads it: the load raises
`CheckpointError` naming the file, and the marker does not exist.

Run as a script (``python test_no_code_on_load.py deepspeed <folder>``) it is the DeepSpeed job,
which needs its own process: DeepSpeed holds a process group and an engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # the DeepSpeed job imports trainer from this checkout
    sys.path.insert(0, str(ROOT))

from trainer.checkpoint.legacy import load_weights_file  # noqa: E402
from trainer.errors import CheckpointError  # noqa: E402


class _MakeDirs:
    """Pickles as ``os.makedirs(marker)``: unpickling it creates the marker folder."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.makedirs, (self.marker,))


class _System:
    """Pickles as ``os.system("touch marker")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _rehash(directory: Path) -> None:
    """What an attacker does after editing a file: the manifest matches again."""
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for name, entry in manifest["files"].items():
        data = (directory / name).read_bytes()
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")


# ---- (a) DCP shards written by the FSDP path -------------------------------------------------
@pytest.fixture
def fsdp(tmp_path: Path) -> Iterator[Any]:
    """An FSDPStrategy on CPU in a 1-process gloo group (as tests/checkpoint/test_sharded.py)."""
    from trainer.strategies.fsdp import FSDPStrategy

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        strategy = FSDPStrategy("cpu")
        strategy.setup_environment()
        yield strategy
    finally:
        dist.destroy_process_group()


def _sharded_checkpoint(
    strategy: Any, path: Path, lr: object = None
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A real sharded checkpoint at ``path``; ``lr`` replaces the saved learning rate if given."""
    from trainer.checkpoint.sharded import save_sharded_checkpoint

    torch.manual_seed(0)
    model = strategy.setup_module(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)))
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    model(torch.randn(3, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer_state = strategy.optimizer_state_dict(optimizer)
    if lr is not None:
        optimizer_state["param_groups"][0]["lr"] = lr  # a byte item in the shard file
    checkpoint = {
        "state_dict": strategy.module_state_dict(model, full=False),
        "optimizer_states": [optimizer_state],
        "epoch": 0,
        "global_step": 1,
    }
    save_sharded_checkpoint(strategy, path, checkpoint)
    return model, optimizer


def _load_sharded(strategy: Any, path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
    from trainer.checkpoint.sharded import load_sharded_checkpoint

    return load_sharded_checkpoint(strategy, path, model, [optimizer])


@pytest.mark.parametrize("payload", [_MakeDirs, _System])
def test_dcp_metadata_that_would_run_code_is_refused(fsdp: Any, tmp_path: Path, payload) -> None:
    path, marker = tmp_path / "step=1", tmp_path / "ran"
    model, optimizer = _sharded_checkpoint(fsdp, path)
    metadata_file = path / "dcp" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())  # our own file: trusted here
    metadata.planner_data = {"evil": payload(marker)}
    metadata_file.write_bytes(pickle.dumps(metadata))
    _rehash(path)

    with pytest.raises(CheckpointError, match=r"dcp/\.metadata: it names the global (os|posix)"):
        _load_sharded(fsdp, path, model, optimizer)
    assert not marker.exists()


def test_dcp_byte_item_that_would_run_code_is_refused(fsdp: Any, tmp_path: Path) -> None:
    path, marker = tmp_path / "step=1", tmp_path / "ran"
    model, optimizer = _sharded_checkpoint(fsdp, path, lr=_MakeDirs(marker))
    assert not marker.exists()  # written by DCP itself: the manifest is already right

    with pytest.raises(CheckpointError, match=r"__0_0\.distcp \(item .*lr.*\): it cannot be read"):
        _load_sharded(fsdp, path, model, optimizer)
    assert not marker.exists()


def test_dcp_metadata_naming_a_shard_outside_its_folder_is_refused(
    fsdp: Any, tmp_path: Path
) -> None:
    path = tmp_path / "step=1"
    model, optimizer = _sharded_checkpoint(fsdp, path)
    metadata_file = path / "dcp" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../../outside.distcp"
    metadata_file.write_bytes(pickle.dumps(metadata))
    _rehash(path)

    with pytest.raises(CheckpointError, match=r"\.metadata, field 'relative_path'.*leaves"):
        _load_sharded(fsdp, path, model, optimizer)


def test_clean_dcp_checkpoint_still_loads_its_byte_items(fsdp: Any, tmp_path: Path) -> None:
    path = tmp_path / "step=1"
    model, optimizer = _sharded_checkpoint(fsdp, path, lr=0.125)

    loaded = _load_sharded(fsdp, path, model, optimizer)
    assert loaded["optimizer_states"][0]["param_groups"][0]["lr"] == 0.125  # a byte item


@pytest.mark.parametrize("payload", [_MakeDirs, _System])
def test_consolidating_dcp_shards_runs_no_code(fsdp: Any, tmp_path: Path, payload) -> None:
    """`trainer checkpoint consolidate` reads ``.metadata`` with the allow-list unpickler too."""
    from trainer.cli.checkpoint import consolidate

    path, marker = tmp_path / "step=1", tmp_path / "ran"
    out = tmp_path / "out.safetensors"
    _sharded_checkpoint(fsdp, path)
    metadata_file = path / "dcp" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    metadata.planner_data = {"evil": payload(marker)}
    metadata_file.write_bytes(pickle.dumps(metadata))
    _rehash(path)
    dist.destroy_process_group()  # `trainer checkpoint consolidate` runs without a group
    try:
        with pytest.raises(
            CheckpointError, match=r"dcp/\.metadata: it names the global (os|posix)"
        ):
            consolidate(path, out)
    finally:
        dist.init_process_group(  # for the fixture's teardown
            "gloo", init_method=f"file://{tmp_path / 'store2'}", rank=0, world_size=1
        )
    assert not marker.exists(), "the payload in dcp/.metadata ran"
    assert not out.exists()


def test_consolidating_dcp_byte_item_that_would_run_code_is_refused(
    fsdp: Any, tmp_path: Path
) -> None:
    from trainer.cli.checkpoint import consolidate

    path, marker = tmp_path / "step=1", tmp_path / "ran"
    _sharded_checkpoint(fsdp, path, lr=_MakeDirs(marker))
    dist.destroy_process_group()
    try:
        with pytest.raises(
            CheckpointError, match=r"__0_0\.distcp \(item .*lr.*\): it cannot be read"
        ):
            consolidate(path, tmp_path / "out.safetensors")
    finally:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store2'}", rank=0, world_size=1
        )
    assert not marker.exists()


def test_consolidating_a_clean_dcp_checkpoint_gives_the_model_weights(
    fsdp: Any, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from trainer.cli.checkpoint import consolidate

    path = tmp_path / "step=1"
    model, _ = _sharded_checkpoint(fsdp, path, lr=0.125)  # a byte item, read without code
    full = {k: v.detach().clone() for k, v in fsdp.module_state_dict(model, full=True).items()}
    dist.destroy_process_group()
    try:
        merged = load_file(str(consolidate(path, tmp_path / "out.safetensors")))
    finally:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store2'}", rank=0, world_size=1
        )
    assert merged.keys() == full.keys()
    for name, tensor in full.items():
        assert torch.equal(merged[name], tensor), name


# ---- (b) DeepSpeed's engine files --------------------------------------------------------------
_DS_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt")


def _deepspeed_job(out: Path) -> None:
    """Train ZeRO-2 in this process, save, poison each engine file, load it both ways."""
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Accelerator
    from trainer.strategies import DeepSpeedStrategy
    from trainer.strategies.deepspeed import load_engine_weights

    accelerator = Accelerator(cpu=True, strategy=DeepSpeedStrategy(stage=2))
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    net = torch.nn.Linear(4, 1)
    model, optimizer, loader = accelerator.prepare(net, torch.optim.AdamW(net.parameters()), loader)
    for inputs, targets in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
        optimizer.step()
        optimizer.zero_grad()
    clean = out / "clean"
    accelerator.save_state(clean)
    results: dict[str, dict[str, str]] = {}
    for name in _DS_FILES:
        poisoned = out / name.split("_")[0]
        shutil.copytree(clean, poisoned)
        file = poisoned / "deepspeed" / "checkpoint" / name
        state = torch.load(file, weights_only=False)  # our own file: trusted here
        state["evil"] = _MakeDirs(out / f"ran-{name}")
        torch.save(state, file)
        _rehash(poisoned)
        for way, load in (
            ("engine", accelerator.load_state),
            ("no_engine", load_engine_weights),
        ):
            try:
                load(poisoned)
                results[f"{name}/{way}"] = {"error": "none"}
            except Exception as err:  # reported to the test, which checks the type
                results[f"{name}/{way}"] = {"error": type(err).__name__, "message": str(err)}
    accelerator.load_state(clean)  # the allowed DeepSpeed classes still load
    results["clean"] = {"error": "none"}
    (out / "results.json").write_text(json.dumps(results), encoding="utf-8")


@pytest.fixture(scope="module")
def deepspeed_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("deepspeed")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    job = subprocess.run(
        [sys.executable, __file__, "deepspeed", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("way", ["engine", "no_engine"])
@pytest.mark.parametrize("name", _DS_FILES)
def test_deepspeed_file_that_would_run_code_is_refused(deepspeed_results, name, way) -> None:
    out, results = deepspeed_results
    result = results[f"{name}/{way}"]
    assert result["error"] == "CheckpointError", result
    assert f"checkpoint/{name}: it cannot be read without running code" in result["message"]
    assert not (out / f"ran-{name}").exists()


def test_clean_deepspeed_checkpoint_still_loads(deepspeed_results) -> None:
    assert deepspeed_results[1]["clean"] == {"error": "none"}


def test_deepspeed_tag_outside_the_engine_folder_is_refused(tmp_path: Path) -> None:
    from trainer.strategies.deepspeed import load_engine_weights

    with pytest.raises(CheckpointError, match=r"state\.json, field 'tag'.*leaves"):
        load_engine_weights(tmp_path, {"tag": "../../elsewhere", "zero_stage": 2})


# ---- (c) a folder written by Hugging Face Accelerate's save_state ------------------------------
@pytest.fixture(scope="module")
def accelerate_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("accelerate")
    folder = tmp_path_factory.mktemp("accelerate")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    job = subprocess.run(
        [sys.executable, str(ROOT / "tests/checkpoint/accelerate_resume_job.py"), "accelerate"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    return folder / "acc_state"


def _accelerator_like_the_job() -> Any:
    from trainer import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(
        torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4)
        )
    )
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters()))
    accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, 5))
    return accelerator


@pytest.mark.parametrize(
    "name", ["optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"]
)
def test_accelerate_file_that_would_run_code_is_refused(
    accelerate_folder: Path, tmp_path: Path, name: str
) -> None:
    folder, marker = tmp_path / "state", tmp_path / "ran"
    shutil.copytree(accelerate_folder, folder)
    accelerator = _accelerator_like_the_job()
    if name == "custom_checkpoint_0.pkl":
        accelerator.register_for_checkpointing(torch.optim.lr_scheduler.ConstantLR(
            torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]), total_iters=1,
        ))  # fmt: skip
        torch.save({"last_epoch": 0}, folder / name)
    state = torch.load(folder / name, weights_only=False)  # Accelerate's own file: trusted here
    state["evil"] = _System(marker)
    torch.save(state, folder / name)

    with pytest.raises(CheckpointError, match=rf"{name}: it cannot be read without running code"):
        accelerator.load_state(folder)
    assert not marker.exists()


def test_clean_accelerate_folder_with_its_rng_file_loads(accelerate_folder: Path) -> None:
    accelerator = _accelerator_like_the_job()
    accelerator.load_state(accelerate_folder)  # random_states_0.pkl: numpy arrays, narrowly
    assert accelerator._schedulers[0].last_epoch == 16


def test_an_empty_optimizer_file_in_an_accelerate_folder_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from trainer import Accelerator

    model = torch.nn.Linear(4, 1)
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "optimizer.bin").touch()  # torch.load raises an EOFError with no message
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(
        CheckpointError, match=r"optimizer\.bin: it ends before .*\(EOFError; an empty"
    ):
        accelerator.load_state(tmp_path)


# ---- (d) single files: a Lightning .ckpt and a legacy .pt ------------------------------------
def _lightning_ckpt(folder: Path) -> Path:
    L = pytest.importorskip("lightning")

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    run = L.Trainer(
        max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=folder, accelerator="cpu", devices=1,
    )  # fmt: skip
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    run.fit(Net(), torch.utils.data.DataLoader(data, batch_size=4))
    path = folder / "last.ckpt"
    run.save_checkpoint(path)
    return path


@pytest.mark.parametrize("kind", ["lightning.ckpt", "legacy.pt"])
def test_single_file_that_would_run_code_is_refused(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "ran"
    if kind == "lightning.ckpt":
        path = _lightning_ckpt(tmp_path)
        checkpoint = torch.load(path, weights_only=False)  # Lightning's own file: trusted here
        checkpoint["loops"]["fit_loop"]["evil"] = _MakeDirs(marker)
    else:
        path = tmp_path / "legacy.pt"
        checkpoint = {"state_dict": torch.nn.Linear(4, 1).state_dict(), "epoch": _System(marker)}
    torch.save(checkpoint, path)

    with pytest.raises(CheckpointError, match=rf"{path.name}: .*without running code"):
        load_weights_file(path)
    assert not marker.exists()


if __name__ == "__main__" and sys.argv[1:2] == ["deepspeed"]:
    _deepspeed_job(Path(sys.argv[2]))
