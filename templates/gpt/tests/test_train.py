"""End to end: the smoke config trains under each precision, with nothing but config changes."""

import math
from pathlib import Path

import pytest
from trainer import ConfigurationError

from char_gpt.config import load_config
from char_gpt.run import main, run

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_smoke_config_trains_and_samples(tmp_path: Path, precision: str) -> None:
    config = load_config(
        CONFIGS / "smoke.yaml",
        ["--trainer.default_root_dir", str(tmp_path), "--trainer.precision", precision],
    )

    outcome = run(config)

    assert math.isfinite(outcome["val/loss"])
    assert outcome["val/loss"] < math.log(256)  # better than guessing among 256 bytes
    assert outcome["sample"].startswith("MARCIUS:\n")
    assert (Path(outcome["log_dir"]) / "metrics.csv").is_file()


def test_strategy_is_a_config_value() -> None:
    config = load_config(CONFIGS / "smoke.yaml", ["--trainer.strategy", "ddp"])

    assert config["trainer"]["strategy"] == "ddp"
    assert load_config(CONFIGS / "default.yaml")["trainer"]["strategy"] == "auto"


def test_a_bad_model_key_names_the_valid_ones(tmp_path: Path) -> None:
    config = load_config(CONFIGS / "smoke.yaml", ["--model.n_layers", "3"])

    with pytest.raises(ConfigurationError, match=r"n_layers.*Valid keys: .*'n_layer'"):
        run(config)


def test_main_reports_an_unknown_strategy_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    status = main(
        [
            "--config", str(CONFIGS / "smoke.yaml"),
            "--trainer.strategy", "no_such_strategy",
            "--trainer.default_root_dir", str(tmp_path),
        ]
    )  # fmt: skip

    assert status == 1
    assert "no_such_strategy" in capsys.readouterr().err
