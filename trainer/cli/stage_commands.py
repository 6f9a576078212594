"""The ``trainer fit|validate|test|predict`` subcommands' glue: register one, run it.

Every token after the stage name goes to the config parser of ``trainer/cli/_config_parser.py``
through `trainer.cli.trainer_cli.run_cli`; the subparser registered here has no options of its
own. The modules ``fit.py``, ``validate.py``, ``test.py`` and ``predict.py`` call it.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainer.cli._config_parser import STAGE_HELP
from trainer.cli.trainer_cli import run_cli

__all__ = ["add_stage_parser", "run_stage", "stage_arguments"]

_ARGS_DEST = "config_args"  # where the argparse subcommand keeps the tokens for jsonargparse


def add_stage_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    stage: str,
    *,
    help_text: str | None = None,
) -> argparse.ArgumentParser:
    """Register ``trainer <stage>``: every token after it goes to the jsonargparse parser.

    The subparser has no options of its own (its prefix character is one no option uses), so
    ``--config``, ``--print_config``, ``--help`` and ``--trainer.max_epochs`` all reach
    `build_config_parser`'s parser, which documents them.

    Args:
        subparsers: the ``trainer`` command's subparsers.
        stage: "fit", "validate", "test" or "predict".
        help_text: the line ``trainer --help`` shows (default: the stage's own).
    """
    summary = help_text or STAGE_HELP[stage]
    parser = subparsers.add_parser(
        stage,
        help=summary,
        description=f"{summary}. See 'trainer {stage} --help'.",
        usage=f"trainer {stage} [--config FILE] [--print_config] [--<section>.<key> VALUE ...]",
        add_help=False,
        prefix_chars="\x00",
    )
    parser.add_argument(_ARGS_DEST, nargs=argparse.REMAINDER)
    return parser


def run_stage(stage: str, args: argparse.Namespace) -> int:
    """Run ``trainer <stage> ...``: the current directory is importable, as with ``python -m``."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return run_cli([stage, *getattr(args, _ARGS_DEST)], prog="trainer")


def stage_arguments(args: argparse.Namespace) -> list[str]:
    """The tokens ``trainer <stage>`` received after the subcommand name."""
    return list(getattr(args, _ARGS_DEST))
