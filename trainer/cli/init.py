"""``trainer init``: start a project from a template.

    $ trainer init --list
    accelerator_loop
    gpt
    image_classifier
    $ trainer init my-digits --template image_classifier
    $ trainer init lm --template gpt --name shakespeare-lm

The new directory holds a working project: its package (named after the project), run configs,
tests that pass with ``python -m pytest`` run inside it, a ``train.py`` that trains with plain
Python, and ready launch configs in ``launch_configs/``. This module owns the command line only;
finding and rendering templates is ``trainer.cli.templates``, their contents are
``templates/`` (see docs/templates.md).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from trainer.errors import ConfigurationError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``init``.

    Examples:
        >>> root = argparse.ArgumentParser(prog="trainer")
        >>> parser = add_parser(root.add_subparsers(dest="command"))
        >>> root.parse_args(["init", "lm", "--template", "gpt"]).template
        'gpt'
    """
    parser = subparsers.add_parser(
        "init",
        help="start a project from a template (--list shows them)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "directory", nargs="?", default=None, help="the new project's directory (created)"
    )
    parser.add_argument("-t", "--template", default=None, help="the template to start from")
    parser.add_argument(
        "--name",
        default=None,
        help="the project name (default: the directory's name); the package is its "
        "lowercase form with '_' for other characters",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty directory (files of the same name are replaced)",
    )
    parser.add_argument(
        "--list", action="store_true", help="print the template names, one per line, and exit"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """List the templates, or render one into ``args.directory``; return 0.

    Raises:
        ConfigurationError: no directory or template given, an unknown template (the message
            lists the valid ones), an invalid ``--name``, or a non-empty directory without
            ``--force``.
    """
    from trainer.cli.templates import list_templates, render_template

    if args.list:
        for template in list_templates():
            print(template.name)
        return 0
    names = ", ".join(t.name for t in list_templates())
    if args.directory is None:
        raise ConfigurationError(
            f"trainer init: give the new project's directory, e.g. `trainer init my-project "
            f"--template gpt`. Templates: {names}."
        )
    if args.template is None:
        raise ConfigurationError(
            f"trainer init {args.directory}: choose a template with --template NAME. Valid "
            f"templates: {names}."
        )
    project = render_template(
        args.template, args.directory, project_name=args.name, force=args.force
    )
    where = _shown(project.directory)
    print(
        f"Created {where} from the {project.template.name!r} template "
        f"(project {project.project}, package {project.package}, {len(project.files)} files).\n"
        "Next:\n"
        f"  cd {where}\n"
        "  python -m pytest                              # its tests, a few seconds\n"
        "  python train.py --config configs/smoke.yaml   # one tiny epoch\n"
        "  python train.py                               # the full run (configs/default.yaml)"
    )
    return 0


def _shown(directory: os.PathLike[str]) -> str:
    """``directory`` relative to the working directory when it can be (else absolute)."""
    try:
        return os.path.relpath(directory)
    except ValueError:  # another drive on Windows
        return os.path.abspath(directory)
