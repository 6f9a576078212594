"""The project templates: where they are, what each one is, and how one becomes a new project.

This module owns finding the templates directory, reading each template's manifest
(``template.yaml``) and rendering a template into a directory: copy its files, rename its
package, fill in the project and package names, and add the launch configs. It does not own the
command line (``trainer/cli/init.py``) or what the templates contain (``templates/`` at the
repository root, documented in ``docs/templates.md``).

A template is a directory of ``templates/`` holding a ``template.yaml``:

    description: one line for `trainer init --list` and the docs
    package: digits_classifier   # its Python package directory, a real importable name
    project: digits-classifier   # its project name (pyproject.toml, README title)

The template is a working project under those default names, so its code can be run and linted
in place; rendering replaces both names wherever they appear as whole words in text files
(``.py``, ``.md``, ``.toml``, ``.yaml``, ``.yml``, ``.cfg``, ``.ini``), renames the package
directory, and copies ``templates/configs/*.yaml`` (the launch configs) to ``launch_configs/``.

Where the templates are found, first match wins: the directory in ``$TRAINER_TEMPLATES_DIR``;
``trainer/_templates`` inside the installed package (a wheel built with the templates as package
data); ``templates/`` beside the ``trainer`` package (a source checkout or an editable install).
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigurationError, describe

__all__ = [
    "LAUNCH_CONFIGS_DIR",
    "MANIFEST",
    "TEMPLATES_DIR_ENV",
    "RenderedProject",
    "TemplateInfo",
    "find_templates_root",
    "get_template",
    "list_templates",
    "project_names",
    "render_template",
]

MANIFEST = "template.yaml"
TEMPLATES_DIR_ENV = "TRAINER_TEMPLATES_DIR"
LAUNCH_CONFIGS_DIR = "launch_configs"  # where a new project gets templates/configs/*.yaml
_LAUNCH_CONFIGS_SOURCE = "configs"
_TEXT_SUFFIXES = frozenset({".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini"})
# Never copied: caches and outputs of running a template in place, and the manifest itself.
_SKIPPED_NAMES = frozenset(
    {
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
        ".benchmarks",
        "runs",
        "build",
        MANIFEST,
    }
)
_SKIPPED_SUFFIXES = (".pyc", ".pyo", ".egg-info")
# Package names a project must not take: importing them from the project would shadow the
# real package (or the project's own tests/configs directories).
_RESERVED_PACKAGES = frozenset({"trainer", "torch", "torchmetrics", "tests", "configs", "yaml"})
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # PEP 508


@dataclass(frozen=True)
class TemplateInfo:
    """One template: its name (the directory), where it is, and its manifest's fields."""

    name: str
    path: Path
    description: str
    package: str
    project: str


@dataclass(frozen=True)
class RenderedProject:
    """What ``render_template`` made: the directory, the names, the files written."""

    directory: Path
    template: TemplateInfo
    project: str
    package: str
    files: tuple[Path, ...]


def find_templates_root() -> Path:
    """The directory holding the templates (see the module docstring for the search order).

    Raises:
        ConfigurationError: ``$TRAINER_TEMPLATES_DIR`` names no directory, or none was found.
    """
    configured = os.environ.get(TEMPLATES_DIR_ENV)
    if configured:
        path = Path(configured)
        if not path.is_dir():
            raise ConfigurationError(
                f"{TEMPLATES_DIR_ENV}={configured!r} is not a directory. Point it at the "
                "templates/ directory of a trainer checkout, or unset it."
            )
        return path
    package_dir = Path(__file__).resolve().parent.parent  # trainer/, from trainer/cli/
    candidates = (package_dir / "_templates", package_dir.parent / "templates")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise ConfigurationError(
        "no project templates found (looked in "
        + ", ".join(str(c) for c in candidates)
        + f"). Set {TEMPLATES_DIR_ENV} to the templates/ directory of a trainer checkout."
    )


def list_templates(root: str | os.PathLike[str] | None = None) -> list[TemplateInfo]:
    """Every template under ``root`` (default: ``find_templates_root()``), sorted by name.

    Examples:
        >>> [t.name for t in list_templates()]
        ['accelerator_loop', 'gpt', 'image_classifier']
    """
    base = Path(root) if root is not None else find_templates_root()
    return [
        _read_manifest(entry)
        for entry in sorted(base.iterdir())
        if entry.is_dir() and (entry / MANIFEST).is_file()
    ]


def get_template(name: str, root: str | os.PathLike[str] | None = None) -> TemplateInfo:
    """The template called ``name``.

    Raises:
        ConfigurationError: no template has that name; the message lists the valid ones.
    """
    templates = list_templates(root)
    for template in templates:
        if template.name == name:
            return template
    valid = ", ".join(t.name for t in templates) or "(none)"
    raise ConfigurationError(
        f"trainer init --template {name!r}: no such template. Valid templates: {valid} "
        "(`trainer init --list`)."
    )


def project_names(name: str) -> tuple[str, str]:
    """``(project, package)`` for a project called ``name``.

    The project name is ``name`` itself (a PEP 508 distribution name); the package is its
    lowercase form with every run of other characters made ``_``.

    Raises:
        ConfigurationError: ``name`` is not a valid project name, or its package name would not
            be importable or would shadow a package the project needs.

    Examples:
        >>> project_names("My-Digits.v2")
        ('My-Digits.v2', 'my_digits_v2')
    """
    if not isinstance(name, str) or not _PROJECT_NAME.match(name):
        raise ConfigurationError(
            f"trainer init --name {describe(name)}: expected a project name of letters, digits, "
            "'-', '_' and '.', starting and ending with a letter or digit (e.g. 'my-project')."
        )
    package = re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")
    problem = None
    if not package.isidentifier() or package[0].isdigit():
        problem = "does not start with a letter"
    elif keyword.iskeyword(package):
        problem = "is a Python keyword"
    elif package in _RESERVED_PACKAGES or package in sys.stdlib_module_names:
        problem = "would shadow an existing module"
    if problem is not None:
        raise ConfigurationError(
            f"trainer init --name {name!r}: its package name {package!r} {problem}. "
            "Choose another --name (e.g. 'my-project')."
        )
    return name, package


def render_template(
    name: str,
    destination: str | os.PathLike[str],
    *,
    project_name: str | None = None,
    force: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> RenderedProject:
    """Create a project in ``destination`` from the template ``name``.

    Args:
        name: a template name (``list_templates()``).
        destination: the new project's directory; created if missing.
        project_name: the project name (default: the directory's name); see ``project_names``.
        force: write into a non-empty ``destination`` (files of the same name are replaced,
            other files are left alone).
        root: the templates directory (default: ``find_templates_root()``).

    Returns:
        A RenderedProject with the directory, names and the files written.

    Raises:
        ConfigurationError: unknown template, invalid name, or a non-empty ``destination``
            without ``force``.

    Examples:
        >>> project = render_template("gpt", "/tmp/shakespeare", project_name="shakespeare")
        >>> project.package, (project.directory / "shakespeare" / "model.py").is_file()
        ('shakespeare', True)
    """
    template = get_template(name, root)
    target = Path(destination)
    project, package = project_names(project_name or target.resolve().name)
    _check_destination(target, force=force)
    target.mkdir(parents=True, exist_ok=True)
    replace = _name_replacer(template, project=project, package=package)
    written: list[Path] = []
    for source, relative in _template_files(template.path):
        parts = relative.parts
        if parts[0] == template.package:
            relative = Path(package, *parts[1:])
        written.append(_copy_file(source, target / relative, replace))
    configs = template.path.parent / _LAUNCH_CONFIGS_SOURCE
    if configs.is_dir():
        for source in sorted(configs.iterdir()):
            if source.is_file() and source.suffix in (".yaml", ".yml", ".md"):
                written.append(_copy_file(source, target / LAUNCH_CONFIGS_DIR / source.name, None))
    return RenderedProject(target, template, project, package, tuple(written))


def _read_manifest(directory: Path) -> TemplateInfo:
    """The TemplateInfo of ``directory`` from its manifest, checked."""
    import yaml

    file = directory / MANIFEST
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigurationError(f"template manifest {file} is not readable YAML: {err}") from err
    missing = [key for key in ("description", "package", "project") if not data.get(key)]
    if missing:
        raise ConfigurationError(
            f"template manifest {file}: missing {missing}. It needs description, package and project."
        )
    return TemplateInfo(
        name=directory.name,
        path=directory,
        description=str(data["description"]),
        package=str(data["package"]),
        project=str(data["project"]),
    )


def _check_destination(target: Path, *, force: bool) -> None:
    """Refuse a file, and a non-empty directory unless ``force``."""
    if target.exists() and not target.is_dir():
        raise ConfigurationError(f"trainer init {target}: it is a file, not a directory.")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ConfigurationError(
            f"trainer init {target}: the directory is not empty. Choose a new directory, or pass "
            "--force to write the template's files into it (files of the same name are replaced)."
        )


def _template_files(base: Path) -> Iterator[tuple[Path, Path]]:
    """``(source, path relative to base)`` of every file to copy, in a stable order."""
    for directory, subdirectories, files in os.walk(base):
        subdirectories[:] = sorted(d for d in subdirectories if not _is_skipped(d))
        for file_name in sorted(files):
            if not _is_skipped(file_name):
                source = Path(directory, file_name)
                yield source, source.relative_to(base)


def _is_skipped(name: str) -> bool:
    return name in _SKIPPED_NAMES or name.endswith(_SKIPPED_SUFFIXES)


def _name_replacer(template: TemplateInfo, *, project: str, package: str) -> Callable[[str], str]:
    """A function putting ``project``/``package`` where the template's names are whole words.

    "Whole word" excludes neighbouring letters, digits, ``_`` and ``-``, so ``digits-classifier``
    inside ``my-digits-classifier`` stays as it is.
    """
    mapping = {template.package: package, template.project: project}
    words = sorted(mapping, key=len, reverse=True)  # longest first: one name may contain another
    names = re.compile(rf"(?<![\w-])(?:{'|'.join(re.escape(w) for w in words)})(?![\w-])")
    return lambda text: names.sub(lambda match: mapping[match.group(0)], text)


def _copy_file(source: Path, target: Path, replace: Callable[[str], str] | None) -> Path:
    """Copy ``source`` to ``target``, filling the names into text files when ``replace`` is set."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if replace is None or source.suffix not in _TEXT_SUFFIXES:
        shutil.copyfile(source, target)
    else:
        target.write_text(replace(source.read_text(encoding="utf-8")), encoding="utf-8")
    return target
