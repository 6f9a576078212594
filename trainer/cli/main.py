"""Entry point of the ``trainer`` command: builds the argparse parser and dispatches.

This module owns the top-level parser (``--help``, ``--version``), the list of subcommands and
the error contract of the command line:

- a ``TrainerError`` raised by a subcommand prints ``error: <message>`` on stderr and exits 1,
  without a traceback;
- a usage error (unknown subcommand, bad option) is argparse's: usage on stderr, exit 2.

It does not own any subcommand's options or work: each subcommand is one module in
``trainer/cli/`` exposing ``add_parser(subparsers)`` and ``run(args) -> int``, listed once in
``COMMANDS`` below. Adding a subcommand is one new module plus one entry in that tuple.

Importing this module imports no optional package (yaml, rich, jsonargparse, ...); a
subcommand imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from trainer import __version__
from trainer.cli import (
    checkpoint,
    config,
    env,
    estimate_memory,
    fit,
    init,
    launch,
    predict,
    test,
    validate,
)
from trainer.errors import TrainerError

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

_PROG = "trainer"
# Key under which each subparser stores its module's ``run``; not a user-visible option.
_RUN_KEY = "_run"


class Command(Protocol):
    """What a subcommand module provides (a module satisfies this Protocol structurally)."""

    def add_parser(
        self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
    ) -> argparse.ArgumentParser:
        """Add the subcommand's parser to ``subparsers`` and return it."""
        ...

    def run(self, args: argparse.Namespace) -> int:
        """Do the subcommand's work; return the process exit status."""
        ...


# The one registry of subcommands, in the order ``trainer --help`` lists them.
# `test` runs the config-driven test stage, or the distributed self-check (selfcheck.py).
COMMANDS: tuple[Command, ...] = (
    fit,
    validate,
    test,
    predict,
    init,
    env,
    launch,
    config,
    checkpoint,
    estimate_memory,
)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``trainer`` parser with every subcommand in ``COMMANDS``.

    Returns:
        The parser; parsing a subcommand sets ``args._run`` to that module's ``run``.

    Examples:
        >>> parser = build_parser()
        >>> args = parser.parse_args(["env"])
        >>> args.command
        'env'
    """
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="trainer: train PyTorch models on one CPU, many GPUs or many machines.",
    )
    parser.add_argument("--version", action="version", version=f"{_PROG} {__version__}")
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="<command>", required=True
    )
    for command in COMMANDS:
        subparser = command.add_parser(subparsers)
        subparser.set_defaults(**{_RUN_KEY: command.run})
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``trainer`` command line and return its exit status.

    Args:
        argv: the arguments after the program name; ``None`` reads ``sys.argv[1:]``.

    Returns:
        0 on success; 1 when the subcommand raised a ``TrainerError`` (printed as
        ``error: <message>`` on stderr); 2 for a usage error (argparse prints the usage);
        0 after ``--help`` or ``--version``.

    Examples:
        >>> main(["--version"])  # doctest: +SKIP
        trainer 0.1.0
        0
        >>> main(["no-such-command"])  # doctest: +SKIP
        usage: trainer [-h] [--version] <command> ...
        trainer: error: argument <command>: invalid choice: 'no-such-command' (choose from env)
        2
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:
        # argparse exits for --help, --version and usage errors; return the status instead so
        # that callers of main() (tests, other tools) get an int like every other outcome.
        return _exit_status(exit_request.code)
    run: Callable[[argparse.Namespace], int] = getattr(args, _RUN_KEY)
    try:
        return run(args)
    except TrainerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _exit_status(code: str | int | None) -> int:
    """Map a ``SystemExit.code`` to an int, as the interpreter would for the process status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
