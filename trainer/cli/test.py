"""``trainer test``: a test epoch from a YAML config, or, without one, the distributed self-check.

Two commands share the name: LightningCLI's ``test --config run.yaml`` (run ``test_step`` over
the test data) and Accelerate's ``test`` (``trainer/cli/selfcheck.py``: a short job on the
launch config's processes). This module registers the one ``test`` subcommand and picks:

- no arguments, or only ``--config_file FILE`` (the launch config): the self-check;
- anything else (``--config``, ``--model``, ``--help``, ...): the config-driven test stage of
  ``trainer/cli/trainer_cli.py``, whose ``--help`` lists every key.

Examples:
    $ trainer test --config run.yaml --ckpt_path last
    $ trainer test --config_file ddp.yaml        # the self-check
"""

from __future__ import annotations

import argparse

from trainer.cli import selfcheck
from trainer.cli.stage_commands import add_stage_parser, run_stage, stage_arguments

__all__ = ["add_parser", "is_selfcheck", "run"]

_HELP = "run one test epoch from a YAML config (without arguments: the distributed self-check)"


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``trainer test``."""
    return add_stage_parser(subparsers, "test", help_text=_HELP)


def run(args: argparse.Namespace) -> int:
    """Run the self-check or the config-driven test stage, by `is_selfcheck`."""
    tokens = stage_arguments(args)
    if is_selfcheck(tokens):
        return selfcheck.run(argparse.Namespace(config_file=_launch_config_file(tokens)))
    return run_stage("test", args)


def is_selfcheck(tokens: list[str]) -> bool:
    """Whether ``trainer test <tokens>`` asks for the self-check rather than a config run.

    Examples:
        >>> is_selfcheck([]), is_selfcheck(["--config_file", "ddp.yaml"])
        (True, True)
        >>> is_selfcheck(["--config", "run.yaml"])
        False
    """
    if not tokens:
        return True
    if len(tokens) == 2:
        return tokens[0] == "--config_file"
    return len(tokens) == 1 and tokens[0].startswith("--config_file=")


def _launch_config_file(tokens: list[str]) -> str | None:
    """The ``--config_file`` value of self-check tokens (None: the default launch config)."""
    if not tokens:
        return None
    return tokens[1] if len(tokens) == 2 else tokens[0].split("=", 1)[1]
