"""Project templates, ``trainer init`` and the launch configs in ``templates/configs/``.

The fast tests pin ``trainer.cli.templates`` and the ``init`` command (listing, names,
errors). The slow ones do what a user does: ``trainer init`` into a fresh directory, run the
new project's own tests with ``python -m pytest`` inside it (nothing installed), then train its
smallest config for one epoch with ``python train.py`` -- every template, on the CPU. The gpt
template also switches its strategy by config alone, on two CPU processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.accelerator.launch_config import load_launch_config
from trainer.cli.main import main
from trainer.cli.templates import (
    LAUNCH_CONFIGS_DIR,
    MANIFEST,
    TEMPLATES_DIR_ENV,
    find_templates_root,
    get_template,
    list_templates,
    project_names,
    render_template,
)
from trainer.errors import ConfigurationError
from trainer.strategies.fsdp_config import parse_fsdp_config

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ("accelerator_loop", "gpt", "image_classifier")
LAUNCH_CONFIGS = sorted((ROOT / "templates" / "configs").glob("*.yaml"))
NEEDS_SKLEARN = ("accelerator_loop", "image_classifier")
SUBPROCESS_TIMEOUT_S = 300


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in ``cwd`` as a user would (the outer pytest's options stay out).

    One intra-op thread per process, as torchrun sets: these models are tiny, and on a busy
    2-core machine extra threads spin waiting on each other (10x the CPU time, measured).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        command,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


def _text_files(directory: Path) -> list[Path]:
    suffixes = {".py", ".md", ".toml", ".yaml", ".yml"}
    return [p for p in directory.rglob("*") if p.is_file() and p.suffix in suffixes]


# ---- listing ----------------------------------------------------------------------------------
def test_list_prints_one_template_name_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "--list"]) == 0

    assert capsys.readouterr().out.splitlines() == list(TEMPLATES)


def test_templates_are_found_in_the_repository_with_their_manifests() -> None:
    templates = list_templates()

    # trainer/_templates links to templates/ (so wheels carry them): the same folder either way.
    assert find_templates_root().resolve() == (ROOT / "templates").resolve()
    assert [t.name for t in templates] == list(TEMPLATES)
    assert all(t.description and t.package.isidentifier() for t in templates)
    assert get_template("gpt").package == "char_gpt"


def test_templates_dir_can_be_set_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = tmp_path / "tiny"
    (template / "tiny_pkg").mkdir(parents=True)
    (template / MANIFEST).write_text("description: d\npackage: tiny_pkg\nproject: tiny\n")
    (template / "tiny_pkg" / "__init__.py").write_text('"""tiny: the tiny_pkg package."""\n')
    monkeypatch.setenv(TEMPLATES_DIR_ENV, str(tmp_path))

    assert [t.name for t in list_templates()] == ["tiny"]
    project = render_template("tiny", tmp_path / "out" / "new-thing")
    assert (project.directory / "new_thing" / "__init__.py").read_text() == (
        '"""new-thing: the new_thing package."""\n'
    )


def test_templates_dir_that_does_not_exist_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEMPLATES_DIR_ENV, "/no/such/templates")

    with pytest.raises(ConfigurationError, match=TEMPLATES_DIR_ENV):
        find_templates_root()


# ---- rendering --------------------------------------------------------------------------------
def test_unknown_template_is_an_error_listing_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError, match="Valid templates: accelerator_loop, gpt, image_classifier"
    ):
        render_template("resnet", tmp_path / "project")

    assert not (tmp_path / "project").exists()


def test_cli_reports_an_unknown_template_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["init", str(tmp_path / "p"), "--template", "resnet"])

    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("error: ") and "image_classifier" in err and "Traceback" not in err


def test_cli_without_a_template_or_directory_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", str(tmp_path / "p")]) == 1
    assert "--template NAME" in capsys.readouterr().err
    assert main(["init", "--template", "gpt"]) == 1
    assert "directory" in capsys.readouterr().err


def test_a_non_empty_directory_needs_force(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")

    with pytest.raises(ConfigurationError, match="--force"):
        render_template("gpt", tmp_path, project_name="lm")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]

    render_template("gpt", tmp_path, project_name="lm", force=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"  # other files are left alone
    assert (tmp_path / "lm" / "model.py").is_file()


def test_a_file_as_destination_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("")

    with pytest.raises(ConfigurationError, match="is a file"):
        render_template("gpt", target, project_name="lm")


def test_name_fills_the_project_and_package_names_everywhere(tmp_path: Path) -> None:
    project = render_template("gpt", tmp_path / "dir", project_name="Shakes-Peare.v2")

    assert (project.project, project.package) == ("Shakes-Peare.v2", "shakes_peare_v2")
    assert (tmp_path / "dir" / "shakes_peare_v2" / "corpus" / "shakespeare.txt").is_file()
    assert not (tmp_path / "dir" / "char_gpt").exists()
    for file in _text_files(tmp_path / "dir"):
        assert not re.search(r"char[_-]gpt", file.read_text()), file
    assert 'name = "Shakes-Peare.v2"' in (tmp_path / "dir" / "pyproject.toml").read_text()
    config = (tmp_path / "dir" / "configs" / "smoke.yaml").read_text()
    assert "class_path: shakes_peare_v2.module.GPTModule" in config


def test_default_project_name_is_the_directory_name(tmp_path: Path) -> None:
    project = render_template("image_classifier", tmp_path / "my-digits")

    assert (project.project, project.package) == ("my-digits", "my_digits")
    assert (tmp_path / "my-digits" / "my_digits" / "module.py").is_file()
    assert not (tmp_path / "my-digits" / MANIFEST).exists()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("2fast", "does not start with a letter"),
        ("torch", "would shadow"),
        ("json", "would shadow"),  # a standard-library module
        ("class", "keyword"),
        ("my project", "expected a project name"),
        ("-x", "expected a project name"),
    ],
)
def test_bad_names_are_refused_with_the_fix(name: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as info:
        project_names(name)

    assert "--name" in str(info.value)


def test_every_project_gets_the_launch_configs(tmp_path: Path) -> None:
    project = render_template("accelerator_loop", tmp_path / "loop")

    copied = sorted(p.name for p in (project.directory / LAUNCH_CONFIGS_DIR).glob("*.yaml"))
    assert copied == [p.name for p in LAUNCH_CONFIGS]


def test_caches_and_run_outputs_are_not_copied(tmp_path: Path) -> None:
    source = tmp_path / "templates" / "tiny"
    (source / "tiny_pkg" / "__pycache__").mkdir(parents=True)
    (source / "runs" / "smoke").mkdir(parents=True)
    (source / MANIFEST).write_text("description: d\npackage: tiny_pkg\nproject: tiny\n")
    (source / "tiny_pkg" / "__init__.py").write_text("")
    (source / "tiny_pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (source / "runs" / "smoke" / "metrics.csv").write_text("step\n")

    project = render_template("tiny", tmp_path / "out", root=tmp_path / "templates")

    assert [p.relative_to(project.directory).as_posix() for p in project.files] == [
        "out/__init__.py"
    ]


# ---- launch configs ---------------------------------------------------------------------------
def test_the_launch_configs_the_issue_asks_for_are_there() -> None:
    names = {p.stem for p in LAUNCH_CONFIGS}

    assert {
        "ddp",
        "fsdp",
        "fsdp_cpu_offload",
        "deepspeed_zero2",
        "deepspeed_zero3",
        "multi_node",
    } <= names


@pytest.mark.parametrize("path", LAUNCH_CONFIGS, ids=lambda p: p.name)
def test_launch_config_loads_as_trainer_launch_reads_it(path: Path) -> None:
    config = load_launch_config(path)

    expected = {"ddp": "ddp", "fsdp": "fsdp", "deepspeed": "deepspeed", "multi": "ddp"}
    assert config.strategy == expected[path.stem.split("_")[0]]
    if config.fsdp_config:
        options = parse_fsdp_config(config.fsdp_config)
        assert options["auto_wrap_policy"] == {"TransformerBlock"}  # the gpt template's layer
        assert options["ignored"] == []
    if config.strategy == "deepspeed":
        assert config.deepspeed_config["zero_stage"] == int(path.stem[-1])
    if path.stem == "multi_node":
        assert config.num_machines == 2 and config.main_process_ip


# ---- end to end: what a user runs -------------------------------------------------------------
def _init(template: str, directory: Path) -> Path:
    result = _run(
        [sys.executable, "-m", "trainer.cli", "init", str(directory), "--template", template],
        cwd=directory.parent,
    )
    assert result.returncode == 0, result.stderr
    assert f"from the '{template}' template" in result.stdout
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES)
def test_new_project_passes_its_own_tests_and_trains_one_epoch(
    tmp_path: Path, template: str
) -> None:
    if template in NEEDS_SKLEARN:
        pytest.importorskip("sklearn", reason="the digits templates need scikit-learn")
    project = _init(template, tmp_path / "my-project")

    tests = _run([sys.executable, "-m", "pytest"], cwd=project)
    assert tests.returncode == 0, f"{template}'s own tests failed:\n{tests.stdout}\n{tests.stderr}"
    assert re.search(r"\d+ passed", tests.stdout)

    smoke = _run([sys.executable, "train.py", "--config", "configs/smoke.yaml"], cwd=project)
    assert smoke.returncode == 0, f"{template} smoke run failed:\n{smoke.stdout}\n{smoke.stderr}"
    assert list((project / "runs" / "smoke").rglob("metrics.csv")), smoke.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_gpt_strategy_is_switched_by_config_alone(tmp_path: Path) -> None:
    project = _init("gpt", tmp_path / "lm")

    ddp = _run(
        [
            *(sys.executable, "train.py", "--config", "configs/smoke.yaml"),
            *(
                "--trainer.strategy",
                "ddp",
                "--trainer.devices",
                "2",
                "--trainer.accelerator",
                "cpu",
            ),
        ],
        cwd=project,
    )
    assert ddp.returncode == 0, f"{ddp.stdout}\n{ddp.stderr}"
    assert "(DDPStrategy, 2 process(es))" in ddp.stdout

    # The launch config chooses FSDP (each TransformerBlock sharded) and bf16; the run config
    # keeps strategy: auto.
    fsdp = _run(
        [
            *(sys.executable, "-m", "trainer.cli", "launch"),
            *("--config_file", f"{LAUNCH_CONFIGS_DIR}/fsdp.yaml", "--mixed_precision", "no"),
            *("train.py", "--config", "configs/smoke.yaml", "--trainer.accelerator", "cpu"),
        ],
        cwd=project,
    )
    assert fsdp.returncode == 0, f"{fsdp.stdout}\n{fsdp.stderr}"
    assert "(FSDPStrategy, 2 process(es))" in fsdp.stdout
