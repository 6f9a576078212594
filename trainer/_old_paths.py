"""Module paths from before the layered layout, still importable.

``import trainer.state`` or ``from trainer.seed import seed_everything`` keep working: a finder
on ``sys.meta_path`` answers each old name with the module that now holds its code, so the old
and the new name are the same module object (one set of globals, classes compare equal).
The mapping is the record of the move; ``docs/layout.md`` lists it for readers.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# old public module path -> the module that holds its code now
OLD_MODULE_PATHS: dict[str, str] = {
    "trainer.state": "trainer.runtime.state",
    "trainer.gradient_state": "trainer.runtime.gradient_state",
    "trainer.seed": "trainer.runtime.seed",
    "trainer.configs": "trainer.runtime.configs",
    "trainer.optimizer": "trainer.accelerator.optimizer",
    "trainer.collectives": "trainer.accelerator.collectives",
    "trainer.memory": "trainer.accelerator.memory",
    "trainer.launcher": "trainer.accelerator.launchers",
    "trainer.launch_config": "trainer.accelerator.launch_config",
    "trainer.module": "trainer.trainer.module",
    "trainer.module_hooks": "trainer.trainer.module_hooks",
    "trainer.hooks": "trainer.trainer.hooks",
    "trainer.templates_index": "trainer.cli.templates",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module ran when it was imported; nothing more to do."""


class _OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = OLD_MODULE_PATHS.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent, so a reload adds no second one)."""
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(_OldPathFinder())
