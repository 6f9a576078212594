"""``trainer predict``: run predict_step over the data from a YAML config (``--config run.yaml``) and options.

This module only registers the subcommand; the parser, the run and the saved config are
``trainer/cli/trainer_cli.py``'s. Every token after ``predict`` goes to that parser.

Examples:
    $ trainer predict --config run.yaml --trainer.limit_val_batches 10
"""

from __future__ import annotations

import argparse

from trainer.cli.stage_commands import add_stage_parser, run_stage

__all__ = ["add_parser", "run"]


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``trainer predict``."""
    return add_stage_parser(subparsers, "predict")


def run(args: argparse.Namespace) -> int:
    """Run the stage from the config; the exit status is `trainer.cli.trainer_cli.run_cli`'s."""
    return run_stage("predict", args)
