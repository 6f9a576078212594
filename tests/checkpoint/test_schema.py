"""Every field a checkpoint gives back is type- and range-checked before anything is restored.

The bad checkpoints are real ones (a short fit saved them) edited afterwards, with the manifest
re-hashed so that the integrity check passes: the attack is consistent, only the schema can
refuse it. Each refusal must name the file, the field and the value, and fit must not train.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoint.resume_job import Net, data
from tests.conftest import quiet_trainer
from trainer.callbacks import Callback
from trainer.checkpoint import (
    find_latest_checkpoint,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)
from trainer.checkpoint.codec import decode
from trainer.checkpoint.format import MANIFEST
from trainer.errors import CheckpointError, ConfigurationError

_DELETE = object()
_STOP_AT = 3  # mid-epoch: progress.batch_idx == 3


class _Hooks(Callback):
    """The hooks a fit reached, and the global step when training started."""

    def __init__(self) -> None:
        self.called: list[str] = []
        self.start_step: int | None = None

    def setup(self, trainer, module, stage):
        self.called.append("setup")

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.called.append("on_load_checkpoint")

    def on_fit_start(self, trainer, module):
        self.called.append("on_fit_start")

    def on_train_start(self, trainer, module):
        self.called.append("on_train_start")
        self.start_step = trainer.global_step


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint: SGD with momentum, a scheduler, dropout, stopped mid-epoch."""
    root = tmp_path_factory.mktemp("schema")
    torch.manual_seed(0)
    t = quiet_trainer(root, max_epochs=2, max_steps=_STOP_AT)
    t.fit(Net(), data())
    t.save_checkpoint(root / "ck")
    return root / "ck"


def _copy(saved: Path, target: Path) -> Path:
    shutil.copytree(saved, target)
    return target


def _rehash(folder: Path) -> None:
    """Recompute every file record in the manifest, as an attacker who edited a file would."""
    manifest = json.loads((folder / MANIFEST).read_text())
    for name in manifest["files"]:
        data_bytes = (folder / name).read_bytes()
        manifest["files"][name] = {
            "size": len(data_bytes),
            "sha256": hashlib.sha256(data_bytes).hexdigest(),
        }
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _edit(document: Any, path: tuple[Any, ...], value: Any) -> None:
    """Set (or delete, with _DELETE) ``document[path[0]][path[1]]...``; list indices are ints."""
    *parents, last = path
    for key in parents:
        document = document[key]
    if value is _DELETE:
        del document[last]
    else:
        document[last] = value


def _edit_json(file: Path, path: tuple[Any, ...], value: Any) -> None:
    document = json.loads(file.read_text())
    _edit(document, path, value)
    file.write_text(json.dumps(document))


def _assert_refused_before_restoring(ckpt_path: Path, root: Path, *fragments: str) -> None:
    torch.manual_seed(1)
    module, hooks = Net(), _Hooks()
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    t = quiet_trainer(root, max_epochs=2, callbacks=[hooks])
    with pytest.raises(CheckpointError) as caught:
        t.fit(module, data(), ckpt_path=ckpt_path)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert hooks.called == ["setup"], hooks.called  # nothing restored, no training
    for key, value in module.state_dict().items():
        assert torch.equal(value, initial[key]), key


def test_an_unedited_checkpoint_resumes(saved, tmp_path):
    hooks = _Hooks()
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[hooks])
    t.fit(Net(), data(), ckpt_path=saved)
    assert hooks.start_step == _STOP_AT and t.global_step == 20
    assert verify_checkpoint(saved)["global_step"] == _STOP_AT


_BAD_STATE = [
    (("progress", "epoch"), "1", "'1' (type str)"),
    (("progress", "global_step"), _DELETE, "is missing"),
    (("progress",), [1, 3, 3], "[1, 3, 3] (type list)"),
    (("progress", "batch_idx"), -1, "-1 (type int)"),
    (("progress", "batch_idx"), True, "True (type bool)"),
    (("progress", "batch_idx"), 2.0, "2.0 (type float)"),
    (("progress", "last_val_step"), -2, "-2 (type int)"),
    (("progress", "last_val_step"), 99, "99 (type int)"),
    (("global_step",), 10**30, f"{10**30} (type int)"),
    (("epoch",), 1e308, "1e+308 (type float)"),
    (("epoch",), {"__float__": "1e308"}, "'1e308' (type str)"),
    (("trainer_checkpoint_version",), 2, "2 (type int)"),
    (("optimizer_states",), {"0": 1}, "{'0': 1} (type dict)"),
    (("optimizer_states", 0, "param_groups"), "x", "'x' (type str)"),
    (("optimizer_states", 0, "param_groups", 0, "params", 0), -5, "-5 (type int)"),
    (("optimizer_states", 0, "param_groups", 0, "params", 0), 1.0, "1.0 (type float)"),
    (("optimizer_states", 0, "param_groups", 0, "params", 0), None, "None (type NoneType)"),
    (("optimizer_states", 0, "param_groups", 0, "params", 0), [0], "[0] (type list)"),
    (("lr_schedulers", 0, "last_epoch"), "3", "'3' (type str)"),
    (("lr_schedulers", 0, "base_lrs", 0), {"__float__": "nan"}, "nan (type float)"),
    (("loops", "train_loader", "seed"), "x", "'x' (type str)"),
    (("loops", "train_loader", "epoch"), -1, "-1 (type int)"),
    (("rng_states",), "x", "'x' (type str)"),
    (("rng_states", 0, "python"), [1, 2], "[1, 2] (type list)"),
    (("rng_states", 0, "torch"), {"__tensor__": "nowhere"}, "'nowhere' (type str)"),
    (("loggers",), [5], "5 (type int)"),
    (("loggers",), [{"name": "csv"}], "is missing"),
    (("callback_metrics", "loss"), "low", "'low' (type str)"),
    (("callbacks",), [1], "[1] (type list)"),
    (("precision",), {"scaler": {"scale": "big"}}, "'big' (type str)"),
    (("hyper_parameters",), "lr=1", "'lr=1' (type str)"),
]


@pytest.mark.parametrize(
    ("path", "value", "received"), _BAD_STATE, ids=[".".join(map(str, p[0])) for p in _BAD_STATE]
)
def test_a_bad_state_field_is_refused_before_anything_is_restored(
    saved, tmp_path, path, value, received
):
    folder = _copy(saved, tmp_path / "ck")
    _edit_json(folder / "state.json", path, value)
    _rehash(folder)
    field = ".".join(map(str, path))
    _assert_refused_before_restoring(folder, tmp_path / "run", "state.json", field, received)
    with pytest.raises(CheckpointError, match="state.json"):
        verify_checkpoint(folder)  # `trainer checkpoint verify` says so too


def _named_optimizer_state(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """``optimizer_state`` keyed by parameter name, as FSDP's full (gathered) state dict keys it."""
    names = [f"module.net.{i}.weight" for i in range(len(optimizer_state["state"]))]
    return {
        "state": dict(zip(names, optimizer_state["state"].values(), strict=True)),
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in optimizer_state["param_groups"]
        ],
    }


def test_an_optimizer_state_keyed_by_parameter_name_is_accepted(saved, tmp_path):
    checkpoint = read_checkpoint(saved)
    named = _named_optimizer_state(checkpoint["optimizer_states"][0])
    folder = write_checkpoint(tmp_path / "named", {**checkpoint, "optimizer_states": [named]})
    read_back = read_checkpoint(folder)["optimizer_states"][0]
    assert read_back["param_groups"][0]["params"] == named["param_groups"][0]["params"]
    assert list(read_back["state"]) == list(named["state"])


@pytest.mark.parametrize(
    ("key", "received"),
    [(-1, "-1 (type int)"), (1.5, "1.5 (type float)"), (True, "True (type bool)"), (None, "None")],
)
def test_an_optimizer_state_key_that_is_neither_index_nor_name_is_refused(
    saved, tmp_path, key, received
):
    checkpoint = read_checkpoint(saved)
    optimizer_state = checkpoint["optimizer_states"][0]
    first, *rest = optimizer_state["state"].items()
    bad = {**optimizer_state, "state": {key: first[1], **dict(rest)}}
    folder = write_checkpoint(tmp_path / "bad", {**checkpoint, "optimizer_states": [bad]})
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(folder)
    message = str(caught.value)
    assert f"field 'optimizer_states.0.state.{key}'" in message, message
    assert "a parameter index" in message and "or a parameter name" in message, message
    assert received in message, message


_BAD_MANIFEST = [
    (("world_size",), "1", "'1' (type str)"),
    (("world_size",), 0, "0 (type int)"),
    (("global_step",), "7", "'7' (type str)"),
    (("global_step",), 10**30, f"{10**30} (type int)"),
    (("epoch",), -1, "-1 (type int)"),
    (("created",), 5, "5 (type int)"),
    (("created",), _DELETE, "is missing"),
    (("files",), ["state.json"], "(type list)"),
    (("files", "model.safetensors", "size"), -1, "-1 (type int)"),
    (("files", "model.safetensors", "size"), "204", "(type str)"),
    (("files", "model.safetensors", "sha256"), "abc", "'abc' (type str)"),
    (("files", "state.json"), "x", "'x' (type str)"),
    (("files", "../outside.bin"), {"size": 1, "sha256": "0" * 64}, "leaves the folder"),
    (("files", "/etc/hostname"), {"size": 1, "sha256": "0" * 64}, "is absolute"),
]


@pytest.mark.parametrize(
    ("path", "value", "received"),
    _BAD_MANIFEST,
    ids=[".".join(map(str, p)) + f"={v!r}"[:20] for p, v, _ in _BAD_MANIFEST],
)
def test_a_bad_manifest_field_is_refused(saved, tmp_path, path, value, received):
    folder = _copy(saved, tmp_path / "ck")
    (tmp_path / "outside.bin").write_bytes(b"x")
    _edit_json(folder / MANIFEST, path, value)
    field = ".".join(map(str, path))
    _assert_refused_before_restoring(folder, tmp_path / "run", MANIFEST, field, received)


def test_format_version_must_be_the_int_one(saved, tmp_path):
    folder = _copy(saved, tmp_path / "ck")
    _edit_json(folder / MANIFEST, ("format_version",), True)
    with pytest.raises(CheckpointError, match="has format version True"):
        read_checkpoint(folder)


@pytest.fixture
def sharded(saved, tmp_path) -> Path:
    """The saved checkpoint rewritten with its weights in three shards plus an index."""
    folder = write_checkpoint(tmp_path / "sharded", read_checkpoint(saved), max_shard_size=150)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    return folder


def test_a_sharded_checkpoint_resumes(sharded, tmp_path):
    hooks = _Hooks()
    quiet_trainer(tmp_path, max_epochs=2, callbacks=[hooks]).fit(Net(), data(), ckpt_path=sharded)
    assert hooks.start_step == _STOP_AT


@pytest.mark.parametrize(
    ("target", "received"),
    [
        ("../outside.safetensors", "leaves the folder"),
        ("ABSOLUTE", "is absolute"),
        ("model-00009-of-00009.safetensors", "which the manifest does not list"),
        (["model-00001-of-00003.safetensors"], "(type list)"),
    ],
    ids=["dotdot", "absolute", "unlisted", "list"],
)
def test_an_index_naming_a_file_outside_or_unlisted_is_refused_before_it_is_read(
    sharded, tmp_path, target, received
):
    outside = tmp_path / "outside.safetensors"
    shutil.copy(sharded / "model-00001-of-00003.safetensors", outside)
    target = str(outside) if target == "ABSOLUTE" else target
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    tensor_name = sorted(index["weight_map"])[0]
    index["weight_map"][tensor_name] = target
    index_file.write_text(json.dumps(index))
    _rehash(sharded)
    _assert_refused_before_restoring(
        sharded,
        tmp_path / "run",
        "model.safetensors.index.json",
        f"weight_map.{tensor_name}",
        received,
    )


def test_an_index_alias_to_no_tensor_is_refused(sharded, tmp_path):
    _edit_json(
        sharded / "model.safetensors.index.json", ("metadata", "aliases"), {"net.0.bias": "nope"}
    )
    _rehash(sharded)
    _assert_refused_before_restoring(
        sharded, tmp_path / "run", "index.json", "metadata.aliases.net.0.bias", "'nope'"
    )


def test_a_symbolic_link_inside_a_checkpoint_is_refused(saved, tmp_path):
    folder = _copy(saved, tmp_path / "ck")
    elsewhere = tmp_path / "elsewhere.safetensors"
    shutil.move(folder / "state.safetensors", elsewhere)
    (folder / "state.safetensors").symlink_to(elsewhere)
    _rehash(folder)  # the hash of what the link points at matches
    _assert_refused_before_restoring(folder, tmp_path / "run", "is a symbolic link")


def test_an_unlisted_file_is_still_refused(saved, tmp_path):
    folder = _copy(saved, tmp_path / "ck")
    (folder / "extra.safetensors").write_bytes(b"x")
    _assert_refused_before_restoring(folder, tmp_path / "run", "does not list: extra.safetensors")


def test_last_skips_a_newer_checkpoint_with_an_invalid_state(saved, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    _copy(saved, checkpoints / "step=3")
    newest = _copy(saved, checkpoints / "step=9")
    _edit_json(newest / "state.json", ("progress", "batch_idx"), -1)
    _edit_json(newest / MANIFEST, ("global_step",), 9)
    _rehash(newest)
    with pytest.warns(UserWarning, match=r"step=9.*progress.batch_idx"):
        assert find_latest_checkpoint(checkpoints) == checkpoints / "step=3"
    hooks = _Hooks()
    with pytest.warns(UserWarning, match="step=9"):
        quiet_trainer(tmp_path, max_epochs=2, callbacks=[hooks]).fit(
            Net(), data(), ckpt_path="last"
        )
    assert hooks.start_step == _STOP_AT


@pytest.mark.parametrize("global_step", ["seven", [9], 9.5, -9])
def test_last_skips_a_manifest_with_a_bad_global_step(saved, tmp_path, global_step):
    checkpoints = tmp_path / "checkpoints"
    _copy(saved, checkpoints / "step=3")
    newest = _copy(saved, checkpoints / "step=9")
    _edit_json(newest / MANIFEST, ("global_step",), global_step)
    with pytest.warns(UserWarning, match=r"skipping .*step=9"):
        assert find_latest_checkpoint(checkpoints) == checkpoints / "step=3"


@pytest.mark.parametrize("ckpt_path", [123, 1.5, b"ck", ["ck"]])
def test_ckpt_path_of_the_wrong_type_is_a_configuration_error(tmp_path, ckpt_path):
    t = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.raises(ConfigurationError, match=r"fit\(ckpt_path=...\).*received .*type"):
        t.fit(Net(), data(), ckpt_path=ckpt_path)


@pytest.mark.parametrize(
    ("encoded", "field"),
    [
        ({"a": {"__tuple__": 5}}, "a"),
        ({"a": [{"__dict__": [[1]]}]}, "a.0"),
        ({"a": {"__bytes__": "not base64!"}}, "a"),
        ({"a": {"__float__": "1e5"}}, "a"),
        ({"a": {"__ndarray__": 5}}, "a"),
        ({"a": {"b": {"__tensor__": 5}}}, "a.b"),
        ({"a": {"__dict__": [[{"__dict__": []}, 1]]}}, "a"),
        ({"a": {"__set__": [{"k": 1}]}}, "a"),  # a dict cannot be a set's element
        ({"a": {"__frozenset__": "ab"}}, "a"),
    ],
)
def test_a_malformed_encoded_value_is_refused_naming_its_path(encoded, field):
    with pytest.raises(CheckpointError, match=rf"state.json: field '{field}'"):
        decode(encoded, {})


# ---- PyTorch Lightning .ckpt: the same validator after conversion ------------------------------

L = pytest.importorskip("lightning")


class _LightningNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net().net

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return Net.configure_optimizers(self)


@pytest.fixture(scope="module")
def lightning_ckpt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What a real Lightning 2.6 run saved mid-epoch (step 3), as torch.load gives it."""
    root = tmp_path_factory.mktemp("lightning-schema")
    trainer = L.Trainer(
        max_steps=_STOP_AT,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(_LightningNet(), data())
    trainer.save_checkpoint(root / "mid.ckpt")
    return torch.load(root / "mid.ckpt", weights_only=True)


_BAD_LIGHTNING = [
    (("epoch",), "1", "'1' (type str)"),
    (("global_step",), 10**30, f"{10**30} (type int)"),
    (("global_step",), 3.0, "3.0 (type float)"),
    (("loops", "fit_loop", "epoch_loop.batch_progress", "current", "processed"), -1, "-1"),
    (("loops", "fit_loop", "epoch_loop.batch_progress", "is_last_batch"), "yes", "'yes'"),
    (("loops", "fit_loop"), [1], "[1] (type list)"),
    (("optimizer_states",), "x", "'x' (type str)"),
    (("lr_schedulers", 0, "last_epoch"), 1.5, "1.5 (type float)"),
]


@pytest.mark.parametrize(
    ("path", "value", "received"),
    _BAD_LIGHTNING,
    ids=[".".join(map(str, p[0])) for p in _BAD_LIGHTNING],
)
def test_a_bad_lightning_field_is_refused(lightning_ckpt, tmp_path, path, value, received):
    import copy

    checkpoint = copy.deepcopy(lightning_ckpt)
    _edit(checkpoint, path, value)
    torch.save(checkpoint, tmp_path / "bad.ckpt")
    field = ".".join(map(str, path))
    _assert_refused_before_restoring(tmp_path / "bad.ckpt", tmp_path, "bad.ckpt", field, received)


def test_an_unedited_lightning_checkpoint_resumes(lightning_ckpt, tmp_path):
    torch.save(lightning_ckpt, tmp_path / "good.ckpt")
    hooks = _Hooks()
    quiet_trainer(tmp_path, max_epochs=2, callbacks=[hooks]).fit(
        Net(), data(), ckpt_path=tmp_path / "good.ckpt"
    )
    assert hooks.start_step == _STOP_AT


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("wait_count", "many", "ValueError"),
        ("best_score", [1], "TypeError"),
        ("patience", _DELETE, "KeyError"),
    ],
)
def test_a_callback_state_that_does_not_fit_is_a_checkpoint_error(tmp_path, field, value, error):
    """Callback states are the callbacks' own (the schema lets anything through): one its
    load_state_dict cannot take is refused naming the checkpoint part, not a bare ValueError."""
    from trainer.callbacks import EarlyStopping

    def stopper() -> EarlyStopping:
        return EarlyStopping(monitor="loss", check_on_train_epoch_end=True)

    torch.manual_seed(0)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[stopper()])
    t.fit(Net(), data())
    t.save_checkpoint(tmp_path / "ck")
    (key,) = [k for k in json.loads((tmp_path / "ck" / "state.json").read_text())["callbacks"]]
    _edit_json(tmp_path / "ck" / "state.json", ("callbacks", key, field), value)
    _rehash(tmp_path / "ck")
    again = quiet_trainer(tmp_path / "run", max_epochs=2, callbacks=[stopper()])
    with pytest.raises(CheckpointError, match=rf"ckpt_path: .*callbacks\[.*EarlyStopping.*{error}"):
        again.fit(Net(), data(), ckpt_path=tmp_path / "ck")
