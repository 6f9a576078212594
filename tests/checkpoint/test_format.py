"""The checkpoint directory format: round trips, manifest integrity, refusals, real write faults."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from trainer.checkpoint import (
    find_latest_checkpoint,
    load_weights_file,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)
from trainer.checkpoint.format import MANIFEST, parse_size, read_state, write_model_files
from trainer.errors import CheckpointError


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model.register_buffer("counter", torch.tensor([3], dtype=torch.int64))
    return model


def _checkpoint(model: torch.nn.Module) -> dict:
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "epoch": 2,
        "global_step": 17,
        "extras": {
            "tuple": (1, "a"), "int_keys": {3: "x"}, "inf": float("inf"), "bytes": b"\x00\x01",
            "array": np.arange(3, dtype=np.int32), "tensor": torch.ones(2), "none": None,
        },
    }  # fmt: skip


def test_round_trip_of_every_part(tmp_path):
    model = _model()
    original = _checkpoint(model)
    path = write_checkpoint(tmp_path / "ck", original)
    assert sorted(os.listdir(path)) == [
        "manifest.json",
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
        "state.safetensors",
    ]
    back = read_checkpoint(path)
    assert back["epoch"] == 2 and back["global_step"] == 17
    for key, value in original["state_dict"].items():
        assert torch.equal(back["state_dict"][key], value)
    state = back["optimizer_states"][0]["state"]
    assert set(state) == set(original["optimizer_states"][0]["state"])  # int keys survive
    assert torch.equal(state[0]["exp_avg"], original["optimizer_states"][0]["state"][0]["exp_avg"])
    extras = back["extras"]
    assert (
        extras["tuple"] == (1, "a")
        and extras["int_keys"] == {3: "x"}
        and extras["inf"] == float("inf")
    )
    assert extras["bytes"] == b"\x00\x01" and extras["none"] is None
    assert isinstance(extras["array"], np.ndarray) and extras["array"].tolist() == [0, 1, 2]
    assert torch.equal(extras["tensor"], torch.ones(2))
    # The model file is plain safetensors that any reader can load.
    assert set(load_file(str(path / "model.safetensors"))) == set(original["state_dict"])


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    path = write_checkpoint(tmp_path / "ck", _checkpoint(_model()), world_size=1)
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["format"] == "trainer-checkpoint" and manifest["format_version"] == 1
    assert manifest["world_size"] == 1 and manifest["global_step"] == 17 and manifest["created"]
    for name, record in manifest["files"].items():
        data = (path / name).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert set(manifest["files"]) == set(os.listdir(path)) - {MANIFEST}


def test_tied_weights_are_stored_once_and_restored(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    path = write_checkpoint(tmp_path / "ck", {"state_dict": model.state_dict()})
    assert len(load_file(str(path / "model.safetensors"))) == 1
    back = read_checkpoint(path)["state_dict"]
    assert set(back) == {"0.weight", "1.weight"} and torch.equal(back["0.weight"], back["1.weight"])


def test_sharded_model_files_with_index(tmp_path):
    state = {f"layer{i}.weight": torch.randn(64, 64) for i in range(5)}  # 16 KiB each
    records = write_model_files(tmp_path, state, max_shard_size="40KB")
    shards = sorted(n for n in records if n.startswith("model-"))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state)
    assert (
        parse_size("10GB") == 10 * 10**9
        and parse_size("2GiB") == 2 * 2**30
        and parse_size(123) == 123
    )
    with pytest.raises(CheckpointError, match="max_shard_size='lots'"):
        parse_size("lots")


def test_sets_and_the_other_plain_values_round_trip(tmp_path):
    """What a module's on_save_checkpoint commonly adds, as Lightning keeps it (it pickles)."""
    extra = {
        "seen": {3, "a", (1, 2)},
        "frozen": frozenset({1.5}),
        "pairs": {(1, "x"): [b"raw", None]},
        "nested": [{"w": torch.ones(2)}, (1, 2.5, "x")],
    }
    path = write_checkpoint(tmp_path / "ck", {"callbacks": {"mine": extra}})
    back = read_checkpoint(path)["callbacks"]["mine"]
    assert back["seen"] == {3, "a", (1, 2)} and type(back["seen"]) is set
    assert back["frozen"] == frozenset({1.5}) and type(back["frozen"]) is frozenset
    assert back["pairs"] == {(1, "x"): [b"raw", None]}
    assert torch.equal(back["nested"][0]["w"], torch.ones(2)) and back["nested"][1] == (1, 2.5, "x")


def test_values_that_cannot_be_stored_are_refused_with_their_path(tmp_path):
    with pytest.raises(
        CheckpointError,
        match=r"cannot store a object at 'state.callbacks.mine'.*nothing is pickled",
    ):
        write_checkpoint(tmp_path / "ck", {"callbacks": {"mine": object()}})
    assert not (tmp_path / "ck").exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("flip", r"model.safetensors does not match its sha256"),
        ("truncate", r"model.safetensors has \d+ bytes; the manifest says"),
        ("missing", r"incomplete: state.json is missing"),
        ("extra", r"holds a file its manifest does not list: notes.txt"),
        ("manifest", r"manifest.json is unreadable or corrupt"),
        ("no_manifest", r"is not a trainer checkpoint: it has no manifest.json"),
        ("foreign", r"is not a trainer checkpoint manifest \(format 'other'\)"),
    ],
)
def test_damaged_checkpoints_are_refused_naming_the_file(tmp_path, damage, match):
    path = write_checkpoint(tmp_path / "ck", _checkpoint(_model()))
    model_file = path / "model.safetensors"
    if damage == "flip":
        data = bytearray(model_file.read_bytes())
        data[len(data) // 2] ^= 0x01
        model_file.write_bytes(bytes(data))
    elif damage == "truncate":
        model_file.write_bytes(model_file.read_bytes()[:-5])
    elif damage == "missing":
        (path / "state.json").unlink()
    elif damage == "extra":
        (path / "notes.txt").write_text("hi")
    elif damage == "manifest":
        (path / MANIFEST).write_text("{not json")
    elif damage == "no_manifest":
        (path / MANIFEST).unlink()
    elif damage == "foreign":
        (path / MANIFEST).write_text(json.dumps({"format": "other", "files": {}}))
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(path)


def test_rewriting_replaces_atomically_and_leaves_no_temporaries(tmp_path):
    write_checkpoint(tmp_path / "ck", {"state_dict": {"w": torch.zeros(2)}, "global_step": 1})
    write_checkpoint(tmp_path / "ck", {"state_dict": {"w": torch.ones(2)}, "global_step": 2})
    assert os.listdir(tmp_path) == ["ck"]
    assert torch.equal(read_checkpoint(tmp_path / "ck")["state_dict"]["w"], torch.ones(2))


def test_a_folder_that_is_not_a_checkpoint_is_never_replaced(tmp_path):
    other = tmp_path / "state"  # e.g. what Accelerate's save_state wrote
    other.mkdir()
    (other / "optimizer.bin").write_bytes(b"user data")
    (other / "random_states_0.pkl").write_bytes(b"more")

    with pytest.raises(CheckpointError, match=r"not a checkpoint \(it holds optimizer.bin, random"):
        write_checkpoint(other, {"state_dict": {"w": torch.zeros(2)}})

    assert sorted(os.listdir(other)) == ["optimizer.bin", "random_states_0.pkl"]
    assert (other / "optimizer.bin").read_bytes() == b"user data"
    assert os.listdir(tmp_path) == ["state"]  # no temporary left behind


def test_a_file_is_never_replaced_but_an_empty_folder_is_used(tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"user data")
    with pytest.raises(CheckpointError, match="it is a file"):
        write_checkpoint(tmp_path / "weights.pt", {"state_dict": {"w": torch.zeros(2)}})
    assert (tmp_path / "weights.pt").read_bytes() == b"user data"

    (tmp_path / "empty").mkdir()
    write_checkpoint(tmp_path / "empty", {"state_dict": {"w": torch.ones(2)}})
    assert torch.equal(read_checkpoint(tmp_path / "empty")["state_dict"]["w"], torch.ones(2))


def test_find_latest_skips_torn_and_corrupt_directories(tmp_path):
    for step in (5, 10):
        write_checkpoint(
            tmp_path / f"step={step}",
            {"state_dict": {"w": torch.full((2,), float(step))}, "global_step": step},
        )
    newest = write_checkpoint(
        tmp_path / "step=15", {"state_dict": {"w": torch.zeros(2)}, "global_step": 15}
    )
    (newest / "model.safetensors").write_bytes(b"garbage")  # corrupt newest
    torn = tmp_path / ".step=20.tmp-1-abc"  # an unfinished write
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "step=25").mkdir()  # no manifest
    with pytest.warns(UserWarning, match="step=15"):
        assert find_latest_checkpoint(tmp_path) == tmp_path / "step=10"
    assert find_latest_checkpoint(tmp_path / "nowhere") is None


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_pickle_payload_that_would_run_code_is_refused_and_not_run(tmp_path):
    _Evil.marker = tmp_path / "pwned"
    payload = tmp_path / "model.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "evil": _Evil()}, payload)
    with pytest.raises(CheckpointError, match="refusing to load .*model.ckpt"):
        load_weights_file(payload)
    assert not _Evil.marker.exists()


def test_legacy_and_plain_safetensors_files_load(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, tmp_path / "lightning.ckpt")
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "weights.safetensors"))
    assert torch.equal(load_weights_file(tmp_path / "plain.pt")["state_dict"]["w"], torch.ones(2))
    assert load_weights_file(tmp_path / "lightning.ckpt")["epoch"] == 3
    assert torch.equal(
        load_weights_file(tmp_path / "weights.safetensors")["state_dict"]["w"], torch.ones(2)
    )
    (tmp_path / "bad.safetensors").write_bytes(b"nope")
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load_weights_file(tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError, match="expected a checkpoint directory"):
        load_weights_file(_touch(tmp_path / "x.txt"))


def _load_with(entry: str, path):
    """``path`` given to ``fit(ckpt_path=)``, ``load_checkpoint_in_model`` or
    ``TrainModule.load_from_checkpoint``."""
    from tests.conftest import LinearModule, make_loader, quiet_trainer
    from trainer import load_checkpoint_in_model

    if entry == "fit":
        quiet_trainer(path.parent, max_steps=1).fit(LinearModule(), make_loader(), ckpt_path=path)
    elif entry == "load_checkpoint_in_model":
        load_checkpoint_in_model(LinearModule(), path)
    else:
        LinearModule.load_from_checkpoint(path)


@pytest.mark.parametrize("entry", ["fit", "load_checkpoint_in_model", "load_from_checkpoint"])
@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
def test_an_empty_legacy_file_is_refused(tmp_path, entry, suffix):
    path = tmp_path / f"empty{suffix}"
    path.touch()  # an IndexError from the empty error message of torch.load before
    with pytest.raises(CheckpointError, match=rf"empty\{suffix} is empty \(0 bytes\)"):
        _load_with(entry, path)


@pytest.mark.parametrize("entry", ["fit", "load_from_checkpoint", "load_checkpoint_in_model"])
def test_a_bare_state_dict_with_int_keys_is_refused(tmp_path, entry):
    torch.save({1: torch.zeros(1)}, tmp_path / "int_keys.ckpt")  # torch's AttributeError before
    with pytest.raises(
        CheckpointError, match=r"int_keys\.ckpt: field 'state_dict\.1' must be a str"
    ):
        _load_with(entry, tmp_path / "int_keys.ckpt")


def _touch(path):
    path.write_text("x")
    return path


def test_write_error_mid_save_raises_and_keeps_the_previous_checkpoint(tmp_path):
    """A real write failure: the file-size limit (RLIMIT_FSIZE) stops the second save midway."""
    script = textwrap.dedent(
        f"""
        import resource, signal, torch
        from trainer.checkpoint import write_checkpoint
        from trainer.errors import CheckpointError
        write_checkpoint({str(tmp_path / "ck")!r}, {{"state_dict": {{"w": torch.zeros(1000)}}, "global_step": 1}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        try:
            write_checkpoint({str(tmp_path / "ck")!r}, {{"state_dict": {{"w": torch.ones(1_000_000)}}, "global_step": 2}})
        except CheckpointError as err:
            print("CheckpointError:", err)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert (
        "CheckpointError: writing checkpoint" in out.stdout and "previous checkpoint" in out.stdout
    ), out.stderr
    assert os.listdir(tmp_path) == ["ck"]  # the temporary directory is gone
    back = read_checkpoint(tmp_path / "ck")
    assert back["global_step"] == 1 and torch.equal(back["state_dict"]["w"], torch.zeros(1000))


def test_unwritable_destination_is_a_checkpoint_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CheckpointError, match="cannot create a checkpoint under"):
        write_checkpoint(tmp_path / "file" / "ck", {"state_dict": {}})


_KILL_WRITER = """
import sys, torch
from trainer.checkpoint import write_checkpoint
root = sys.argv[1]
print("ready", flush=True)
step = 0
while True:
    step += 1
    state = {{"w{{}}".format(i): torch.full((64, 1024), float(step)) for i in range(8)}}
    write_checkpoint(f"{{root}}/step={{step % 3}}", {{"state_dict": state, "global_step": step, "note": "x" * 1000}})
"""


@pytest.mark.slow
def test_sigkill_at_twenty_moments_never_leaves_a_wrong_checkpoint(tmp_path):
    import random
    import signal
    import time

    rng = random.Random(0)
    for attempt in range(20):
        root = tmp_path / f"run{attempt}"
        root.mkdir()
        process = subprocess.Popen(
            [sys.executable, "-c", _KILL_WRITER.format(), str(root)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.6))
        process.send_signal(signal.SIGKILL)
        process.wait()
        for entry in root.iterdir():
            if (entry / MANIFEST).exists() and not entry.name.startswith("."):
                manifest = verify_checkpoint(entry)  # anything that looks complete is valid
                step = manifest["global_step"]
                assert torch.equal(
                    read_checkpoint(entry)["state_dict"]["w0"], torch.full((64, 1024), float(step))
                )
        latest = find_latest_checkpoint(root)
        if latest is not None:
            verify_checkpoint(latest)


def test_read_state_gives_state_json_verified_without_the_tensors(tmp_path):
    """What a caller needs before the weights (hyperparameters, a DataModule's state), read
    after hashing only the state files; the large files are left to read_checkpoint."""
    original = _checkpoint(_model())
    original["datamodule"] = {"phase": 2, "mean": torch.tensor([1.5])}
    path = write_checkpoint(tmp_path / "ck", original)
    state = read_state(path)
    assert "state_dict" not in state and "optimizer_states" not in state
    assert state["global_step"] == 17 and state["datamodule"]["phase"] == 2
    assert torch.equal(state["datamodule"]["mean"], torch.tensor([1.5]))
    model_file = path / "model.safetensors"  # a flipped weight: read_checkpoint's to refuse
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    model_file.write_bytes(bytes(data))
    assert read_state(path)["global_step"] == 17
    with pytest.raises(CheckpointError, match="model.safetensors does not match"):
        read_checkpoint(path)


@pytest.mark.parametrize("name", ["state.json", "state.safetensors"])
def test_read_state_refuses_an_altered_state_file(tmp_path, name):
    original = _checkpoint(_model())
    path = write_checkpoint(tmp_path / "ck", original)
    data = bytearray((path / name).read_bytes())
    data[-3] ^= 0x01
    (path / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{name} does not match"):
        read_state(path)
    (path / name).write_bytes(bytes(data[:-1]))
    with pytest.raises(CheckpointError, match=f"{name} has \\d+ bytes"):
        read_state(path)
