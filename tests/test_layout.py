"""The package layout: layers import downwards only, old module paths still import, files stay small.

The layer order is the one in docs/layout.md. Imports under ``if TYPE_CHECKING:`` are type
hints, not dependencies, and are not counted.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from trainer._old_paths import OLD_MODULE_PATHS

PACKAGE = Path(__file__).resolve().parent.parent / "trainer"

# bottom to top; a module may import its own package or any package in a lower tier
TIERS: tuple[frozenset[str], ...] = (
    frozenset({"base"}),  # trainer.errors, trainer._imports, trainer._warnings
    frozenset({"runtime"}),
    frozenset({"precision", "checkpoint", "data", "profilers"}),
    frozenset({"big_modeling"}),
    frozenset({"strategies"}),
    frozenset({"loggers", "plugins"}),
    frozenset({"accelerator"}),
    # the Trainer installs default callbacks; callbacks read the Trainer's hook table
    frozenset({"trainer", "callbacks"}),
    frozenset({"cli"}),
)
TIER_OF = {package: index for index, tier in enumerate(TIERS) for package in tier}
SAME_TIER_ALLOWED = frozenset({"trainer", "callbacks"})
MAX_LINES = 500


def _package_of(module: str) -> str:
    """The sub-package a module path belongs to; top-level modules and names are the base."""
    parts = module.split(".")
    if len(parts) < 2 or not (PACKAGE / parts[1] / "__init__.py").exists():
        return "base"
    return parts[1]


def _source_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_templates" not in p.parts)


def _runtime_imports(path: Path) -> list[tuple[str, int]]:
    """``(imported trainer module, line)`` for every import not under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer"):
            if node.module == "trainer":
                found += [(f"trainer.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("trainer.")]
    return found


def test_every_package_has_a_tier() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} - {"_templates"}
    assert packages == set(TIER_OF) - {"base"}


def test_layers_import_downwards_only() -> None:
    wrong = []
    for path in _source_files():
        if path == PACKAGE / "__init__.py":
            continue  # the facade re-exports every layer's public names
        if path == PACKAGE / "__main__.py":
            continue  # ``python -m trainer``: the CLI's entry point, above every layer
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        source = _package_of(module)
        for target_module, line in _runtime_imports(path):
            target = _package_of(target_module)
            if target == source:
                continue
            if TIER_OF[target] < TIER_OF[source]:
                continue
            if TIER_OF[target] == TIER_OF[source] and {source, target} <= SAME_TIER_ALLOWED:
                continue
            wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target_module}")
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in _source_files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _private_imports(path: Path, package: str) -> list[str]:
    """``from M import _name`` (another module's private name), and private modules imported
    from outside the package that holds them."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("trainer"):
            continue
        module_parts = node.module.split(".")
        for alias in node.names:
            parts = [*module_parts, alias.name]
            first = next((i for i, p in enumerate(parts) if p[:1] == "_" and p[:2] != "__"), None)
            if first is None:
                continue
            owner = ".".join(parts[:first])  # what holds the private module or name
            is_module = (PACKAGE.parent / Path(*parts).with_suffix(".py")).exists() or (
                PACKAGE.parent / Path(*parts) / "__init__.py"
            ).exists()
            if first == len(parts) - 1 and not is_module:
                found.append(
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{alias.name}"
                )
            elif not (package == owner or package.startswith(owner + ".")):
                found.append(
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{alias.name}"
                )
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """Issue #16: no module reaches into another's private members (``from x import _name``)."""
    wrong = []
    for path in _source_files():
        if path.name == "_old_paths.py" or path == PACKAGE / "__init__.py":
            continue  # the old-path aliases and the facade name private modules on purpose
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        wrong += _private_imports(path, package)
    assert not wrong, "private imports:\n" + "\n".join(wrong)


@pytest.mark.parametrize("old", sorted(OLD_MODULE_PATHS))
def test_old_module_path_is_the_new_module(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(OLD_MODULE_PATHS[old])


def test_old_paths_in_a_fresh_interpreter() -> None:
    """``from trainer.seed import ...`` as the first import, before ``import trainer`` ran."""
    code = (
        "from trainer.seed import seed_everything\n"
        "from trainer.state import PartialState\n"
        "from trainer.module import TrainModule\n"
        "from trainer.launch_config import load_launch_config\n"
        "import trainer.hooks, trainer.runtime.seed\n"
        "from trainer.accelerator import Accelerator\n"
        "from trainer.trainer import Trainer\n"
        "from trainer.big_modeling import init_empty_weights\n"
        "import trainer\n"
        "assert seed_everything is trainer.seed_everything\n"
        "assert trainer.hooks is trainer.trainer.hooks\n"
        "assert Accelerator is trainer.Accelerator and Trainer is trainer.Trainer\n"
        "assert TrainModule is trainer.TrainModule\n"
        "assert PartialState is trainer.PartialState\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_packages_export_what_they_did() -> None:
    import trainer
    import trainer.accelerator
    import trainer.big_modeling
    import trainer.trainer

    assert trainer.accelerator.Accelerator is trainer.Accelerator
    assert trainer.trainer.Trainer is trainer.Trainer
    for name in ("init_empty_weights", "load_checkpoint_and_dispatch", "UserCpuOffloadHook"):
        assert getattr(trainer.big_modeling, name) is not None
    for name in trainer.__all__:
        assert getattr(trainer, name) is not None
