"""``python -m trainer``: the same entry point as the ``trainer`` console script.

Examples:
    $ python -m trainer --help
"""

from __future__ import annotations

from trainer.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
