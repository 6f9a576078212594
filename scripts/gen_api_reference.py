"""Generate the API reference pages docs/api/*.md from the packages' ``__all__`` lists.

Each page is a list of mkdocstrings directives (``::: trainer.trainer.Trainer``) that
``mkdocs build`` fills from the docstrings. Pages are never edited by hand: every public name of
``trainer``, ``trainer.callbacks``, ``trainer.loggers``, ``trainer.strategies``,
``trainer.precision``, ``trainer.checkpoint``, ``trainer.profilers`` and ``trainer.plugins``
gets an entry, so a name added to an ``__all__`` appears in the reference (or ``--check`` fails
in CI).

Usage:
    python scripts/gen_api_reference.py           # (re)write docs/api/
    python scripts/gen_api_reference.py --check   # exit 1 if a page is stale
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
API_DIR = ROOT / "docs" / "api"
PUBLIC_PACKAGES = (
    "trainer",
    "trainer.callbacks",
    "trainer.loggers",
    "trainer.strategies",
    "trainer.precision",
    "trainer.checkpoint",
    "trainer.profilers",
    "trainer.plugins",
    "trainer.data",
    "trainer.utilities",
)


class Page(NamedTuple):
    """One reference page: its file, title, introduction and the rule for what it holds."""

    file: str
    title: str
    intro: str
    modules: tuple[str, ...]  # a name lands here when it is defined in one of these modules
    extra: tuple[str, ...] = ()  # public names outside the packages' __all__ lists


PAGES = (
    Page(
        "trainer.md",
        "Trainer and TrainModule",
        "The managed loop ([guide](../trainer.md)) and the classes you subclass for it "
        "([guide](../trainmodule.md)).",
        ("trainer.trainer", "trainer.runtime.seed", "trainer.data.combined", "trainer.utilities"),
        ("trainer.cli.trainer_cli.TrainerCLI",),
    ),
    Page(
        "accelerator.md",
        "Accelerator",
        "The layer under the Trainer, public for your own loop ([guide](../accelerator.md)).",
        (
            "trainer.accelerator",
            "trainer.runtime.state",
            "trainer.runtime.configs",
            "trainer.runtime.engine_plugins",
            "trainer.runtime.kwargs_handlers",
            "trainer.data.loader",
            "trainer.data.transfer",
        ),
        (
            "trainer.accelerator.parallelism.strategy_for_parallelism",
            "trainer.accelerator.parallelism.maybe_context_parallel",
        ),
    ),
    Page(
        "strategies.md",
        "Strategies",
        "How a model and its data are placed on devices and processes ([guide](../strategies.md)).",
        ("trainer.strategies",),
    ),
    Page(
        "precision.md",
        "Precision",
        "The number formats of training ([guide](../precision.md)).",
        ("trainer.precision",),
    ),
    Page(
        "callbacks.md",
        "Callbacks",
        "Everything in `trainer.callbacks` ([guide](../callbacks.md)).",
        ("trainer.callbacks",),
    ),
    Page(
        "loggers.md",
        "Loggers",
        "Everything in `trainer.loggers` ([guide](../loggers.md)).",
        ("trainer.loggers",),
    ),
    Page(
        "profilers.md",
        "Profilers",
        "Everything in `trainer.profilers` ([guide](../profilers.md)).",
        ("trainer.profilers",),
    ),
    Page(
        "plugins.md",
        "Plugins",
        "Everything in `trainer.plugins` ([guide](../checkpointing.md#asynchronous-saves)).",
        ("trainer.plugins",),
    ),
    Page(
        "checkpoint.md",
        "Checkpoint files",
        "Reading, writing and verifying checkpoint directories ([guide](../checkpointing.md)).",
        ("trainer.checkpoint",),
    ),
    Page(
        "big_modeling.md",
        "Big models",
        "Building, placing and loading models larger than one device ([guide](../big_models.md)).",
        ("trainer.big_modeling",),
    ),
    Page(
        "errors.md",
        "Errors",
        "Every error the framework raises is a `TrainerError` ([guide](../errors.md)).",
        ("trainer.errors",),
    ),
)


def _public_names() -> list[tuple[str, str]]:
    """``(qualified name where defined, package it is exported from)`` for each public name."""
    found: dict[str, str] = {}
    for package_name in PUBLIC_PACKAGES:
        package = importlib.import_module(package_name)
        for name in package.__all__:
            obj = getattr(package, name)
            is_defined_elsewhere = inspect.isclass(obj) or inspect.isfunction(obj)
            module = obj.__module__ if is_defined_elsewhere else package_name
            found.setdefault(f"{module}.{name}", package_name)
    return sorted(found.items())


def _page_of(qualified: str, exported_from: str) -> Page:
    module = qualified.rsplit(".", 1)[0]
    for page in PAGES:  # the most specific module rule wins: trainer.strategies before trainer
        if any(module == m or module.startswith(m + ".") for m in page.modules):
            return page
    raise SystemExit(
        f"{qualified} (exported from {exported_from}) fits no page: add its module to PAGES."
    )


# Facades whose public methods live partly in base classes (docs/layout.md): show those too.
WITH_INHERITED_MEMBERS = frozenset(
    {"trainer.accelerator.accelerator.Accelerator", "trainer.trainer.trainer.Trainer"}
)


def _directive(qualified: str) -> str:
    if qualified in WITH_INHERITED_MEMBERS:
        return f"::: {qualified}\n    options:\n      inherited_members: true\n"
    return f"::: {qualified}\n"


def render() -> dict[str, str]:
    """The text of every page, keyed by file name (the index included)."""
    entries: dict[str, list[str]] = {page.file: list(page.extra) for page in PAGES}
    for qualified, exported_from in _public_names():
        entries[_page_of(qualified, exported_from).file].append(qualified)
    header = "<!-- generated by scripts/gen_api_reference.py; do not edit -->\n\n"
    pages: dict[str, str] = {}
    index = [
        f"{header}# API reference\n",
        "Generated from the docstrings of every public name. The guides explain how the parts "
        "fit together; these pages list every argument.\n",
        "| Page | Names |",
        "| --- | --- |",
    ]
    for page in PAGES:
        names = sorted(entries[page.file], key=lambda q: q.rsplit(".", 1)[1].lower())
        body = [f"{header}# {page.title}\n", page.intro + "\n"]
        body += [_directive(qualified) for qualified in names]
        pages[page.file] = "\n".join(body)
        shown = ", ".join(f"`{q.rsplit('.', 1)[1]}`" for q in names)
        index.append(f"| [{page.title}]({page.file}) | {shown} |")
    pages["index.md"] = "\n".join(index) + "\n"
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    pages = render()
    if args.check:
        stale = sorted(
            name
            for name, text in pages.items()
            if not (API_DIR / name).exists() or (API_DIR / name).read_text(encoding="utf-8") != text
        )
        extra = sorted(p.name for p in API_DIR.glob("*.md") if p.name not in pages)
        if stale or extra:
            print(
                f"docs/api is stale ({', '.join(stale + extra)}): "
                "run `python scripts/gen_api_reference.py`.",
                file=sys.stderr,
            )
            return 1
        return 0
    API_DIR.mkdir(exist_ok=True)
    for stale_page in API_DIR.glob("*.md"):
        if stale_page.name not in pages:
            stale_page.unlink()
    for name, text in pages.items():
        (API_DIR / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(pages)} pages to {API_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
