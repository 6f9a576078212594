"""End to end: the smoke config trains, evaluates, logs, and saves the model and the state."""

import csv
from pathlib import Path

import pytest
from trainer import ConfigurationError

from digits_loop.config import load_config
from digits_loop.loop import train
from digits_loop.run import main

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_smoke_config_trains_evaluates_and_saves(tmp_path: Path, mixed_precision: str) -> None:
    config = load_config(
        CONFIGS / "smoke.yaml",
        [
            "--training.output_dir", str(tmp_path),
            "--accelerator.mixed_precision", mixed_precision,
        ],
    )  # fmt: skip

    outcome = train(config)

    assert 0.0 <= outcome["test/acc"] <= 1.0
    assert outcome["steps"] == 1  # 2 batches, 2 accumulation steps: one optimizer step
    assert (Path(outcome["model_dir"]) / "model.safetensors").is_file()
    assert (Path(outcome["state_dir"]) / "manifest.json").is_file()
    with open(outcome["metrics_csv"], newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert any(row.get("test/acc") for row in rows)


def test_a_bare_no_in_yaml_means_no_mixed_precision() -> None:
    config = load_config(CONFIGS / "smoke.yaml", ["--accelerator.mixed_precision", "no"])

    assert config.accelerator["mixed_precision"] == "no"


def test_an_unknown_key_names_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"epochs.*Valid keys: \['max_epochs'"):
        load_config(CONFIGS / "smoke.yaml", ["--training.epochs", "3"])


def test_main_reports_a_config_error_without_a_traceback(capsys: pytest.CaptureFixture) -> None:
    status = main(["--config", str(CONFIGS / "smoke.yaml"), "--accelerator.precision", "bf16"])

    assert status == 1
    assert "mixed_precision" in capsys.readouterr().err
