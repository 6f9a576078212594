"""Tests of trainer/cli/: the real ``trainer`` command (module and console script) and collect_env."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainer
from trainer.cli import env, main
from trainer.errors import TrainerError

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_KEYS = [
    "trainer_version",
    "python_version",
    "platform",
    "torch_version",
    "torch_cuda_version",
    "cuda_available",
    "gpu_count",
    "gpu_names",
    "mps_available",
    "cpu_count",
    "total_ram",
    "torchmetrics",
    "safetensors",
    "rich",
    "tensorboard",
    "wandb",
    "mlflow",
    "deepspeed",
    "torch_xla",
    "megatron.core",
    "jsonargparse",
]


def _console_script() -> str | None:
    """The installed ``trainer`` script, preferring the one beside this interpreter."""
    search_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("trainer", path=search_path)


@pytest.fixture(params=["module", "package", "console_script"])
def trainer_cmd(request: pytest.FixtureRequest) -> list[str]:
    """How to start the command: ``python -m trainer.cli``, ``python -m trainer`` or the
    ``trainer`` executable."""
    if request.param in ("module", "package"):
        return [sys.executable, "-m", "trainer.cli" if request.param == "module" else "trainer"]
    script = _console_script()
    if script is None:
        pytest.skip("the `trainer` console script is not on PATH")
    return [script]


def run_cli(command: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real command in a fresh process, as a user would."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=120,
        check=False,
    )


def parse_lines(text: str) -> dict[str, str]:
    """``key: value`` lines (not indented) -> dict."""
    pairs = {}
    for line in text.splitlines():
        if line and not line.startswith(" "):
            key, _, value = line.partition(": ")
            pairs[key] = value
    return pairs


def expected_optional_version(distributions: tuple[str, ...]) -> str:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


# -- the real command ------------------------------------------------------------------------


def test_help_lists_subcommands(trainer_cmd: list[str]) -> None:
    result = run_cli(trainer_cmd, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: trainer")
    env_lines = [line for line in result.stdout.splitlines() if line.strip().startswith("env ")]
    assert len(env_lines) == 1
    assert "print versions" in env_lines[0]


def test_version(trainer_cmd: list[str]) -> None:
    result = run_cli(trainer_cmd, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"trainer {trainer.__version__}"


def test_env_prints_expected_facts(trainer_cmd: list[str]) -> None:
    result = run_cli(trainer_cmd, "env")
    assert result.returncode == 0, result.stderr
    facts = parse_lines(result.stdout)
    assert list(facts) == ENV_KEYS
    assert facts["trainer_version"] == trainer.__version__
    assert facts["python_version"] == platform.python_version()
    assert facts["platform"] == platform.platform()
    assert facts["torch_version"] == torch.__version__
    assert facts["cuda_available"] == str(torch.cuda.is_available())
    assert facts["mps_available"] == str(torch.backends.mps.is_available())
    assert facts["cpu_count"] == str(os.cpu_count())
    assert facts["total_ram"].endswith(" GiB")
    for module, distributions in env.OPTIONAL_PACKAGES.items():
        assert facts[module] == expected_optional_version(distributions), module
    assert facts["torchmetrics"] == importlib.metadata.version("torchmetrics")


def test_env_config_file_prints_top_level_keys(trainer_cmd: list[str], tmp_path: Path) -> None:
    config = tmp_path / "ddp.yaml"
    config.write_text(
        "strategy: ddp\nnum_processes: 2\nmixed_precision: bf16\n"
        "fsdp:\n  reshard_after_forward: true\ndevices: [0, 1]\n",
        encoding="utf-8",
    )
    result = run_cli(trainer_cmd, "env", "--config_file", str(config))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index(f"config_file: {config}")
    assert lines[start + 1 :] == [
        "  strategy: ddp",
        "  num_processes: 2",
        "  mixed_precision: bf16",
        '  fsdp: {"reshard_after_forward": true}',
        "  devices: [0, 1]",
    ]
    assert parse_lines(result.stdout)["torch_version"] == torch.__version__


def test_env_missing_config_file_fails_in_one_line(trainer_cmd: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = run_cli(trainer_cmd, "env", "--config_file", str(missing))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert message.startswith("error: ")
    assert str(missing) in message
    assert "--config_file" in message


@pytest.mark.parametrize(
    ("content", "hint"),
    [("strategy: [ddp\nbad: {", "not valid YAML"), ("- just\n- a list\n", "mapping")],
)
def test_env_bad_config_file_fails_in_one_line(tmp_path: Path, content: str, hint: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content, encoding="utf-8")
    result = run_cli([sys.executable, "-m", "trainer.cli"], "env", "--config_file", str(bad))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert message.startswith("error: ")
    assert str(bad) in message and hint in message


def test_unknown_subcommand_is_a_usage_error(trainer_cmd: list[str]) -> None:
    result = run_cli(trainer_cmd, "no-such-command")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: trainer")
    assert "invalid choice: 'no-such-command'" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_subcommand_is_a_usage_error() -> None:
    result = run_cli([sys.executable, "-m", "trainer.cli"])
    assert result.returncode == 2
    assert "usage: trainer" in result.stderr


def test_import_and_env_load_no_optional_package() -> None:
    optional = ["yaml", "rich", "jsonargparse", "torchmetrics", "tensorboard", "wandb", "mlflow"]
    code = (
        "import sys\n"
        "import trainer.cli.main\n"
        f"loaded = [m for m in {optional!r} if m in sys.modules]\n"
        "from trainer.cli.env import collect_env\n"
        "collect_env()\n"
        f"loaded += [m for m in {optional!r} if m in sys.modules]\n"
        "print(loaded)\n"
    )
    result = run_cli([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- in-process ------------------------------------------------------------------------------


def test_collect_env_keys_and_values() -> None:
    facts = env.collect_env()
    assert list(facts) == ENV_KEYS
    assert all(isinstance(value, str) and value for value in facts.values())
    assert facts["torch_version"] == torch.__version__
    assert facts["platform"] == platform.platform()
    assert facts["gpu_count"] == str(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if facts["gpu_count"] == "0":
        assert facts["gpu_names"] == "none"
    assert facts["torch_cuda_version"] == str(torch.version.cuda or "none (CPU build)")


def test_collect_env_optional_versions_come_from_metadata() -> None:
    facts = env.collect_env()
    for module, distributions in env.OPTIONAL_PACKAGES.items():
        assert facts[module] == expected_optional_version(distributions), module
    assert facts["safetensors"] == importlib.metadata.version("safetensors")


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs Linux /proc/meminfo")
def test_collect_env_total_ram_matches_meminfo() -> None:
    line = next(
        line
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    expected = int(line.split()[1]) * 1024 / 2**30
    assert env.collect_env()["total_ram"] == f"{expected:.1f} GiB"


def test_read_config_file_empty_file_has_no_keys(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert env.read_config_file(empty) == {}


def test_main_in_process_returns_status_and_prints(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main.main(["env"]) == 0
    assert parse_lines(capsys.readouterr().out)["torch_version"] == torch.__version__

    assert main.main(["env", "--config_file", str(tmp_path / "nope.yaml")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: config file ")

    assert main.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"trainer {trainer.__version__}"
    assert main.main(["no-such-command"]) == 2


def test_trainer_error_from_a_subcommand_is_one_line_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing_run(args: object) -> int:
        raise TrainerError("something is wrong; do this to fix it")

    monkeypatch.setattr(env, "run", failing_run)
    assert main.main(["env"]) == 1
    assert capsys.readouterr().err == "error: something is wrong; do this to fix it\n"


def test_other_errors_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug is not a user error: it keeps its traceback.
    def buggy_run(args: object) -> int:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(env, "run", buggy_run)
    with pytest.raises(ZeroDivisionError):
        main.main(["env"])


def test_every_registered_command_has_the_module_contract(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main.main(["--help"]) == 0
    help_text = capsys.readouterr().out
    root = argparse.ArgumentParser(prog="trainer")
    subparsers = root.add_subparsers()
    names = []
    for command in main.COMMANDS:
        assert callable(command.run)
        names.append(command.add_parser(subparsers).prog.split()[-1])
    assert "env" in names
    for name in names:
        assert re.search(rf"^    {name}\b", help_text, re.MULTILINE), (
            f"`trainer --help` does not list {name}"
        )


# -- trainer checkpoint --------------------------------------------------------------------------
def test_checkpoint_consolidate_of_dcp_shards_runs_no_code(tmp_path: Path) -> None:
    """A payload re-hashed into ``dcp/.metadata`` is refused in one line; it never runs."""
    import pickle

    import torch.distributed as dist

    from tests.checkpoint.test_no_code_on_load import _MakeDirs, _rehash, _sharded_checkpoint
    from trainer.strategies.fsdp import FSDPStrategy

    path, marker, out = tmp_path / "step=1", tmp_path / "ran", tmp_path / "full.safetensors"
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        strategy = FSDPStrategy("cpu")
        strategy.setup_environment()
        _sharded_checkpoint(strategy, path)
    finally:
        dist.destroy_process_group()
    command = [sys.executable, "-m", "trainer.cli", "checkpoint"]
    assert run_cli(command, "consolidate", str(path), str(out)).returncode == 0  # honest: merges
    out.unlink()
    metadata_file = path / "dcp" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())  # our own file: trusted here
    metadata.planner_data = {"evil": _MakeDirs(marker)}
    metadata_file.write_bytes(pickle.dumps(metadata))
    _rehash(path)

    assert run_cli(command, "verify", str(path)).returncode == 0  # hashes match: not enough
    result = run_cli(command, "consolidate", str(path), str(out))
    assert result.returncode == 1, result.stderr
    assert re.fullmatch(r"error: .*dcp/\.metadata: it names the global (os|posix)\.makedirs.*\n",
                        result.stderr), result.stderr  # fmt: skip
    assert not marker.exists(), "the payload in dcp/.metadata ran"
    assert not out.exists()


def test_checkpoint_verify_of_a_non_safetensors_weights_file_is_one_line(tmp_path: Path) -> None:
    """A pickle re-hashed in place of ``model.safetensors``: status 1 and one line, no traceback."""
    import hashlib
    import json
    import pickle

    from trainer.checkpoint import write_checkpoint

    folder = write_checkpoint(tmp_path / "ck", {"state_dict": torch.nn.Linear(2, 2).state_dict()})
    (folder / "model.safetensors").write_bytes(pickle.dumps({"not": "weights"}))
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, record in manifest["files"].items():
        data = (folder / name).read_bytes()
        record.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    command = [sys.executable, "-m", "trainer.cli", "checkpoint"]
    for args in (["verify", str(folder)], ["consolidate", str(folder), str(tmp_path / "o.st")]):
        result = run_cli(command, *args)
        assert result.returncode == 1, result.stderr
        assert re.fullmatch(rf"error: checkpoint {re.escape(str(folder))} could not be verified: .*\n",
                            result.stderr), result.stderr  # fmt: skip
