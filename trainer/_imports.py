"""One helper to import optional packages, raising MissingDependencyError with the pip extra."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from trainer.errors import MissingDependencyError


def require(module: str, *, extra: str, feature: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming ``pip install 'trainer[extra]'``.

    Args:
        module: the dotted module name to import, e.g. ``"wandb"``.
        extra: the pip extra of `trainer` that installs it.
        feature: what needs it, for the message (defaults to the module name).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        what = feature or module
        raise MissingDependencyError(
            f"{what} needs the package '{module.split('.')[0]}', which is not installed "
            f"({err}). Install it with: pip install 'trainer[{extra}]'"
        ) from err


def is_available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
