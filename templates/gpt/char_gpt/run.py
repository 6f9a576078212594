"""Train from a run config, validating each epoch, then print a sample: what ``train.py`` does.

    python train.py                                  # configs/default.yaml, 5 epochs
    python train.py --config configs/smoke.yaml      # 1 epoch of 4 batches: checks the plumbing
    python train.py --trainer.precision bf16-mixed --model.n_layer 6
    python train.py --trainer.strategy ddp --trainer.devices 2 --trainer.accelerator cpu

The strategy (``single | ddp | fsdp | deepspeed``) and the precision are config values; the
code does not change. With ``devices`` > 1 the Trainer restarts this script under torchrun;
``trainer launch --config_file launch_configs/fsdp.yaml train.py`` does the same from a launch
config. The file also runs with ``trainer fit --config configs/default.yaml`` once the project
is importable (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer import ConfigurationError, DataModule, TrainerError, TrainModule, seed_everything

from char_gpt.config import (
    build_trainer,
    instantiate,
    load_config,
)

__all__ = ["DEFAULT_CONFIG", "main", "run"]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Build the model, data and Trainer that ``config`` names, and fit.

    Returns:
        ``{"val/loss": float, "train/loss": float, "sample": str | None, "log_dir": str | None,
        "checkpoint": str, "is_global_zero": bool, "strategy": str, "world_size": int}``.
    """
    seed = config.get("seed_everything", 0)
    if seed is not None and seed is not False:
        seed_everything(None if seed is True else int(seed))  # before the model: seeded init
    module = instantiate(config.get("model"), "model")
    if not isinstance(module, TrainModule):
        raise ConfigurationError(
            f"model: expected a class_path to a trainer.TrainModule, got {type(module).__name__}."
        )
    data = instantiate(config.get("data"), "data")
    if data is not None and not isinstance(data, DataModule):
        raise ConfigurationError(
            f"data: expected a class_path to a trainer.DataModule, got {type(data).__name__}."
        )
    trainer = build_trainer(config.get("trainer"))
    trainer.fit(module, datamodule=data, ckpt_path=config.get("ckpt_path"))
    metrics = trainer.callback_metrics
    checkpoint = trainer.checkpoint_callback
    return {
        "val/loss": float(metrics["val/loss"]) if "val/loss" in metrics else float("nan"),
        "train/loss": float(metrics["train/loss"]) if "train/loss" in metrics else float("nan"),
        "sample": getattr(module, "sample_text", None),
        "log_dir": trainer.log_dir,
        "checkpoint": checkpoint.best_model_path if checkpoint is not None else "",
        "is_global_zero": trainer.is_global_zero,
        "strategy": type(trainer.strategy).__name__,
        "world_size": trainer.world_size,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--config FILE`` and ``--section.key VALUE`` overrides, run, print the results.

    Returns 0 on success, 1 (with ``error: ...`` on stderr) on a configuration error.
    """
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
        epilog="Any other --section.key VALUE overrides the config (e.g. --trainer.max_epochs 3).",
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="the YAML run config")
    args, overrides = parser.parse_known_args(argv)
    try:
        outcome = run(load_config(args.config, overrides))
    except TrainerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if outcome["is_global_zero"]:
        print(
            f"val/loss: {outcome['val/loss']:.4f}  "
            f"({outcome['strategy']}, {outcome['world_size']} process(es))"
        )
        if outcome["log_dir"]:
            print(f"metrics: {os.path.join(outcome['log_dir'], 'metrics.csv')}")
        if outcome["checkpoint"]:
            print(f"checkpoint: {outcome['checkpoint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
