"""The ``trainer`` command line.

This package owns the ``trainer`` console script (``trainer.cli.main:main``) and its
subcommands, one module per subcommand (``trainer/cli/env.py`` for ``trainer env``). It owns
argument parsing and how results and errors are printed; it does not own training, launching
or checkpoint logic, which live in the layers below and are only called from here.

Run it as ``trainer <command> ...`` or ``python -m trainer.cli <command> ...``.

Nothing is re-exported here on purpose: ``trainer.cli.main`` stays the name of the module,
not of the function inside it.
"""

from __future__ import annotations

__all__: list[str] = []
