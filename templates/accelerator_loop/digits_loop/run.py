"""The command line of the loop: ``python train.py [--config FILE] [--section.key VALUE ...]``.

Examples::

    python train.py                                    # 20 epochs on scikit-learn's digits
    python train.py --config configs/smoke.yaml        # 1 epoch of 2 batches: the plumbing
    python train.py --accelerator.mixed_precision bf16 --accelerator.gradient_accumulation_steps 4
    trainer launch --config_file launch_configs/ddp_cpu.yaml train.py   # 2 processes
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from trainer import TrainerError

from digits_loop.config import load_config
from digits_loop.loop import train

__all__ = ["DEFAULT_CONFIG", "main"]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the loop; print the test accuracy and where the model and metrics went.

    Returns 0 on success, 1 (with ``error: ...`` on stderr) on a configuration error.
    """
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
        epilog="Any other --section.key VALUE overrides the config (e.g. --training.max_epochs 3).",
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="the YAML run config")
    args, overrides = parser.parse_known_args(argv)
    try:
        outcome = train(load_config(args.config, overrides))
    except TrainerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if outcome["is_main_process"]:
        print(f"test accuracy: {outcome['test/acc']:.4f}")
        print(f"metrics: {outcome['metrics_csv']}")
        print(f"model: {outcome['model_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
