"""The examples run end to end: as scripts (``--fast``) and, marked slow, the full digits job."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_module_from_file

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run_script(name: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--fast", "--root-dir", str(root)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _metrics_rows(root: Path) -> list[dict[str, str]]:
    files = sorted(root.glob("*/version_*/metrics.csv"))
    assert len(files) == 1, f"expected one metrics.csv under {root}, found {files}"
    with files[0].open(newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def _load_example(name: str) -> ModuleType:
    return load_module_from_file(EXAMPLES / f"{name}.py", f"example_{name}")


@pytest.mark.parametrize("script", ["digits.py", "accelerator_loop.py"])
def test_example_runs_fast_and_writes_metrics(script: str, tmp_path: Path) -> None:
    result = _run_script(script, tmp_path)

    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    rows = _metrics_rows(tmp_path)
    assert rows, "metrics.csv has a header but no rows"
    assert all(row["step"] for row in rows)
    assert any(row.get("test/acc") for row in rows), "the test accuracy was not logged"
    assert "test accuracy:" in result.stdout
    assert "metrics.csv" in result.stdout


@pytest.mark.slow
def test_digits_full_job_reaches_its_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    digits = _load_example("digits")

    exit_code = digits.main(["--root-dir", str(tmp_path)])

    output = capsys.readouterr().out
    assert exit_code == 0, output[-2000:]
    rows = _metrics_rows(tmp_path)
    val_rows = [row for row in rows if row.get("val/acc")]
    test_rows = [row for row in rows if row.get("test/acc")]
    assert len(val_rows) == 20, "one validation row per epoch (sanity checks are not logged)"
    assert len(test_rows) == 1
    assert float(test_rows[0]["test/acc"]) >= digits.MIN_TEST_ACCURACY
