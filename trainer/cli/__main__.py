"""``python -m trainer.cli``: the same entry point as the ``trainer`` console script.

Examples:
    $ python -m trainer.cli env
"""

from __future__ import annotations

from trainer.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
