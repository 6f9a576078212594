"""End to end: the smoke config trains, validates, tests and writes metrics and a checkpoint."""

from pathlib import Path

import pytest
from trainer import ConfigurationError

from digits_classifier.config import load_config
from digits_classifier.run import main, run

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_smoke_config_runs_end_to_end(tmp_path: Path, precision: str) -> None:
    config = load_config(
        CONFIGS / "smoke.yaml",
        ["--trainer.default_root_dir", str(tmp_path), "--trainer.precision", precision],
    )

    outcome = run(config)

    assert 0.0 <= outcome["test/acc"] <= 1.0
    assert (Path(outcome["log_dir"]) / "metrics.csv").is_file()
    assert outcome["checkpoint"] and Path(outcome["checkpoint"]).exists()


def test_default_config_builds_the_same_objects() -> None:
    config = load_config(CONFIGS / "default.yaml")

    assert config["trainer"]["max_epochs"] == 20
    assert config["model"]["class_path"].endswith(".module.DigitsClassifier")


def test_short_override_goes_into_init_args() -> None:
    config = load_config(CONFIGS / "smoke.yaml", ["--model.lr=0.05", "--trainer.max_epochs", "3"])

    assert config["model"]["init_args"]["lr"] == 0.05
    assert config["trainer"]["max_epochs"] == 3


def test_a_bad_key_names_the_valid_ones(tmp_path: Path) -> None:
    config = load_config(CONFIGS / "smoke.yaml", ["--model.learning_rate", "0.1"])

    with pytest.raises(ConfigurationError, match=r"learning_rate.*Valid keys: \['lr'"):
        run(config)


def test_main_reports_a_config_error_without_a_traceback(capsys: pytest.CaptureFixture) -> None:
    status = main(["--config", str(CONFIGS / "smoke.yaml"), "--trainer.max_epoch", "3"])

    assert status == 1
    assert "max_epoch" in capsys.readouterr().err
