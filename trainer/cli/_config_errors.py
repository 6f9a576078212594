"""Turn jsonargparse's parse errors into one-line messages that name the key and the choices.

This module owns the wording of the errors of config-driven runs (``trainer fit --config ...``)
that come from parsing: an unknown key, a wrong type, a class path that does not import, a
missing required key, a config file that is missing or not YAML. Each message names the full
dotted key (``trainer.max_epochs``, ``model.init_args.lr``), says what was expected and what
was received, and lists the valid choices (keys of that section, types, or known classes).
It also owns `describe_type`, the text form of a type hint that the messages and the CLI
reference page (``scripts/gen_cli_reference.py``) share.

It does not own the parser (``trainer/cli/_config_parser.py``) nor any check of values that parse
fine but that a constructor rejects (the Trainer raises those itself).

jsonargparse reports errors as text, not as structured data, so the rules below read that text;
a message no rule recognizes is passed on, joined into one line, rather than guessed at.

Examples:
    >>> explain_parse_error("unrecognized arguments: --trainer.max_epoch 3", parser)  # doctest: +SKIP
    "unknown key 'trainer.max_epoch' (did you mean 'trainer.max_epochs'?). Valid keys under
    'trainer': accelerator, accumulate_grad_batches, ..."
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "NON_CONFIG_DESTS",
    "describe_type",
    "explain_parse_error",
    "known_subclasses",
    "section_keys",
]

# Options of the parser that are not keys of a config (``--config``, ``--print_config``, ...).
NON_CONFIG_DESTS = ("help", "config", "print_config", "print_shtab")

_PARSER_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":', re.MULTILINE)
_CLASS_PROBLEM = re.compile(
    r"Problem with given class_path '(?P<class_path>[^']+)':\s*\n\s*(?P<detail>[^\n]+)"
    r"(?:\s*\n\s*(?P<more>[^\n]+))?"
)
_NOT_ACCEPTED = re.compile(r"^Option '(?P<option>[^']+)' is not accepted")
_INNER_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":')
_GIVEN = re.compile(r"(?:Given value|Got value): (?P<value>[^\n]*)")
_GIVEN_TYPE = re.compile(r"Given value type: <class '(?P<type>[^']+)'>")
_IMPORT_FAILURE = re.compile(r"(No module named '[^']+'|module '[^']+' has no attribute '[^']+')")


def explain_parse_error(message: str, parser: Any) -> str:
    """The one-line message for a jsonargparse ``ArgumentError`` raised by ``parser``.

    Args:
        message: ``str(error)``.
        parser: the jsonargparse ``ArgumentParser`` that raised it (its keys are the choices).

    Returns:
        The message; jsonargparse's own text, on one line, when no rule recognizes it.
    """
    text = message.strip()
    rules: tuple[Callable[[str, Any], str | None], ...] = (
        _unrecognized_argument,
        _missing_value,
        _section_file,
        _unknown_group_option,
        _unknown_top_level_option,
        _missing_required_key,
        _class_problem,
        _unknown_class,
        _wrong_type,
    )
    for rule in rules:
        explained = rule(text, parser)
        if explained is not None:
            return explained
    return _one_line(text)


def section_keys(parser: Any, section: str) -> list[str]:
    """The keys directly under ``section`` ("" for the top level), sorted."""
    depth = len(section.split(".")) if section else 0
    prefix = f"{section}." if section else ""
    names = set()
    for dest in _config_dests(parser):
        if dest.startswith(prefix):
            names.add(dest.split(".")[depth])
    return sorted(names)


def known_subclasses(base: type) -> list[str]:
    """Import paths of the public, already imported subclasses of ``base`` (``base`` excluded).

    A class re-exported by its package (``trainer.callbacks.EarlyStopping``) is shown by that
    shorter path, as the saved configs write it.
    """
    seen: dict[str, None] = {}
    pending = list(base.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if cls.__name__.startswith("_") or "<locals>" in cls.__qualname__:
            continue
        seen[_public_path(cls)] = None
    return sorted(seen)


def describe_type(hint: Any) -> str:
    """A type hint as a user reads it: ``int | None``, ``one of 'min', 'max'``, ``list[Callback]``.

    Examples:
        >>> describe_type(int | None)
        'int | None'
        >>> describe_type(typing.Literal["norm", "value"])
        "one of 'norm', 'value'"
    """
    if hint is None or hint is type(None):
        return "None"
    if isinstance(hint, str):
        return hint
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(value) for value in arguments)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(describe_type(argument) for argument in arguments)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(describe_type(argument) for argument in arguments)}]"
    if hint is Any:
        return "Any"
    return getattr(hint, "__name__", str(hint))


# ---- the rules, in the order they are tried ---------------------------------------------------
def _unrecognized_argument(text: str, parser: Any) -> str | None:
    """``--trainer.max_epoch 3`` on the command line."""
    match = re.match(r"(?i)unrecognized arguments: (?P<args>.+)", text)
    if match is None:
        return None
    first = match["args"].split()[0]
    if not first.startswith("-"):
        return (
            f"unexpected argument {first!r}: options are written --<section>.<key> VALUE "
            "(e.g. --trainer.max_epochs 3), config files are given with --config FILE."
        )
    key = first.lstrip("-").split("=", 1)[0].rstrip("+")
    return _unknown_key(key, parser)


def _missing_value(text: str, parser: Any) -> str | None:
    """``--optimizer.lr`` followed by another option instead of a value."""
    match = re.match(r"argument (?P<options>\S+): expected one argument", text)
    if match is None:
        return None
    option = match["options"].split("/")[-1]  # "-c/--config": the long name
    return f"option {option} needs a value: {option} VALUE."


def _section_file(text: str, parser: Any) -> str | None:
    """``--trainer FILE`` (one section from its own file) that is missing or has a bad key."""
    match = re.match(
        r'Parser key "(?P<key>[^"]+)":\s*\nUnable to load config \'(?P<file>[^\n]*)\'', text
    )
    if match is None:
        return None
    key, path = match["key"], match["file"]
    nested = re.search(r'^(?P<indent> *)- (?P<inner>Parser key "[^"]+":\s*\n[\s\S]*)', text, re.M)
    if nested is not None and "Unable to load config" not in nested["inner"]:
        width = len(nested["indent"]) + 2
        first, *rest = nested["inner"].splitlines()
        inner = "\n".join([first, *(line[width:] for line in rest)])
        return f"--{key} {path}: {explain_parse_error(inner, parser)}"
    return (
        f"--{key} {path!r}: no such YAML file. --{key} takes a file holding the '{key}' "
        "section's keys (or give them in the --config file)."
    )


def _unknown_group_option(text: str, parser: Any) -> str | None:
    """``trainer: {max_epoch: 3}`` in a config file."""
    match = re.match(r"Group '(?P<group>[^']+)' does not accept option '(?P<option>[^']+)'", text)
    if match is None:
        return None
    return _unknown_key(f"{match['group']}.{match['option']}", parser)


def _unknown_top_level_option(text: str, parser: Any) -> str | None:
    """``modle: ...`` (a key no section has) in a config file."""
    match = _NOT_ACCEPTED.match(text)
    if match is None:
        return None
    return _unknown_key(match["option"], parser)


def _missing_required_key(text: str, parser: Any) -> str | None:
    match = re.match(r'Key "(?P<key>[^"]+)" is required', text)
    if match is None:
        return None
    key = match["key"]
    return (
        f"missing required key '{key}': set it in the config file or pass --{key} VALUE "
        "on the command line."
    )


def _class_problem(text: str, parser: Any) -> str | None:
    """An error inside a ``class_path`` + ``init_args`` section: bad init arg or import."""
    section = _PARSER_KEY.match(text)
    problem = _CLASS_PROBLEM.search(text)
    if section is None or problem is None:
        return None
    key, class_path = section["key"], problem["class_path"]
    detail = problem["detail"].strip()
    unknown = _NOT_ACCEPTED.match(detail)
    if unknown is not None:
        option = unknown["option"]
        if _import_class(class_path) is _subclass_base(parser, key):  # no class_path given yet
            return _unknown_under_class(f"{key}.init_args.{option}", key)
        choices = _init_arguments(class_path)
        return _format_unknown(
            f"{key}.init_args.{option}",
            [f"{key}.init_args.{name}" for name in choices],
            f"'{key}.init_args' ({class_path})",
            choices,
        )
    inner = _INNER_KEY.match(detail)
    if inner is not None:
        argument = inner["key"]
        expected = _init_annotation(class_path, argument)
        received = _received(problem["more"] or "")
        return (
            f"wrong type for '{key}.init_args.{argument}' ({class_path}): expected {expected}, "
            f"received {received}."
        )
    if _IMPORT_FAILURE.search(detail):
        return _format_bad_class(key, class_path, detail, parser)
    return f"'{key}' ({class_path}): {detail.rstrip('.')}."


def _unknown_class(text: str, parser: Any) -> str | None:
    """A ``class_path`` that names no class, an ambiguous short name, or a foreign class."""
    section = _PARSER_KEY.match(text)
    if section is None:
        return None
    key = section["key"]
    base = _subclass_base(parser, key)
    choices = known_subclasses(base) if base is not None else []
    listed = f" Known classes: {', '.join(choices)}." if choices else ""
    ambiguous = re.search(r"Multiple subclasses with name [^\n]+", text)
    if ambiguous is not None:
        return f"'{key}': {ambiguous.group(0).rstrip('.')}."
    unknown = re.search(r"Expected a dot import path string: (?P<name>\S+)", text)
    if unknown is not None:
        name = unknown["name"]
        return f"'{key}': no class named {name!r}{_did_you_mean(name, choices)}.{listed}"
    foreign = re.search(r"does not correspond to a subclass of (?P<base>\w+)", text)
    if foreign is not None:
        ported = _lightning_counterpart(text, choices)
        return f"'{key}': {_received(text)} is not a subclass of {foreign['base']}.{ported}{listed}"
    if "Not a valid subclass of" in text:
        return f"'{key}': {_received(text)} is not a class_path + init_args entry.{listed}"
    return None


def _wrong_type(text: str, parser: Any) -> str | None:
    section = _PARSER_KEY.match(text)
    if section is None:
        return None
    key = section["key"]
    if key == "config":
        return f"--config: {_one_line(text[section.end() :]).rstrip('.')}."
    action = _action(parser, key)
    hint = getattr(action, "_typehint", None)
    expected = describe_type(hint) if hint is not None else "another value"
    return f"wrong type for '{key}': expected {expected}, received {_received(text)}."


# ---- helpers ----------------------------------------------------------------------------------
_LIGHTNING_CLASS = re.compile(r"(?:lightning\.pytorch|pytorch_lightning)(?:\.\w+)*\.(?P<name>\w+)")


def _lightning_counterpart(text: str, choices: list[str]) -> str:
    """For a Lightning class in a ported config: the sentence naming ours of the same name."""
    lightning = _LIGHTNING_CLASS.search(text)
    if lightning is None:
        return ""
    ours = [choice for choice in choices if choice.rsplit(".", 1)[-1] == lightning["name"]]
    if not ours:
        return ""
    return (
        f" {lightning.group(0)} is Lightning's class: write {ours[0]} (or its short name "
        f"{lightning['name']}) in a config for trainer."
    )


def _unknown_key(key: str, parser: Any) -> str:
    """The message for a key no section has, with the keys of its nearest known section."""
    parts = key.split(".")
    known = set(_config_dests(parser))
    groups = {dest.rsplit(".", 1)[0] for dest in known if "." in dest}
    section = ""
    for end in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in groups:
            section = candidate
            break
        if candidate in known:  # e.g. model.lrr: a class section, keys are its init_args
            return _unknown_under_class(key, candidate)
    if not section:
        key = parts[0]  # `modle.class_path`: the section itself is unknown
    names = section_keys(parser, section)
    full = [f"{section}.{name}" if section else name for name in names]
    label = f"'{section}'" if section else "the top level"
    return _format_unknown(key, full, label, names)


def _unknown_under_class(key: str, section: str) -> str:
    """A ``--model.lr`` before any ``--model CLASS``: the class decides which keys exist."""
    return (
        f"unknown key '{key}': '{section}' takes class_path and init_args; give the class "
        f"first (--{section} CLASS, or class_path in the config), then its arguments."
    )


def _did_you_mean(name: str, choices: list[str]) -> str:
    """`` (did you mean 'torch.optim.AdamW'?)`` for a short or full class name, else ""."""
    by_short = {choice.rsplit(".", 1)[-1].lower(): choice for choice in choices}
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1].lower(), list(by_short), n=1)
    return f" (did you mean '{by_short[close[0]]}'?)" if close else ""


def _format_unknown(key: str, candidates: list[str], label: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    suggestion = f" (did you mean '{close[0]}'?)" if close else ""
    listed = ", ".join(names) or "none"
    return f"unknown key '{key}'{suggestion}. Valid keys under {label}: {listed}."


def _format_bad_class(key: str, class_path: str, detail: str, parser: Any) -> str:
    module_name = class_path.rpartition(".")[0]
    base = _subclass_base(parser, key)
    choices: list[str] = []
    if base is not None and module_name:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        if module is not None:
            choices = sorted(
                f"{module_name}.{name}"
                for name, value in vars(module).items()
                if inspect.isclass(value) and issubclass(value, base) and value is not base
            )
    if not choices and base is not None:
        choices = known_subclasses(base)
    hint = f" Valid choices: {', '.join(choices)}." if choices else ""
    return (
        f"'{key}': cannot import class_path '{class_path}' ({detail.rstrip('.')}). Check the "
        f"dotted path; the current directory and PYTHONPATH are searched.{hint}"
    )


def _received(text: str) -> str:
    given = _GIVEN.search(text)
    if given is None:
        return "another value"
    value = given["value"].strip()
    kind = _GIVEN_TYPE.search(text)
    if kind is None or kind["type"] == "str":
        return repr(value)
    return f"{value} ({kind['type']})"


def _config_dests(parser: Any) -> list[str]:
    """Every key a config may set (options like --help and --config excluded)."""
    dests = []
    # argparse's list, with no public accessor; jsonargparse keeps nested keys in it
    for action in parser._actions:  # noqa: SLF001
        dest = action.dest
        if dest in NON_CONFIG_DESTS or dest.endswith(".help") or dest == "==SUPPRESS==":
            continue
        if type(action).__name__ == "_ActionConfigLoad":  # --trainer FILE: not a key of its own
            continue
        dests.append(dest)
    return dests


def _action(parser: Any, dest: str) -> Any:
    return next((action for action in parser._actions if action.dest == dest), None)  # noqa: SLF001


def _subclass_base(parser: Any, key: str) -> type | None:
    """The base class a ``class_path`` under ``key`` must subclass, from the action's type."""
    hint = getattr(_action(parser, key), "_typehint", None)
    pending = [hint]
    while pending:
        current = pending.pop(0)
        if inspect.isclass(current) and current.__module__ != "builtins":
            return current
        pending.extend(typing.get_args(current))
    return None


def _import_class(class_path: str) -> type | None:
    module_name, _, name = class_path.rpartition(".")
    try:
        value = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return value if inspect.isclass(value) else None


def _init_parameters(class_path: str) -> dict[str, inspect.Parameter]:
    cls = _import_class(class_path)
    if cls is None:
        return {}
    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return {}
    return {
        name: parameter
        for name, parameter in list(signature.parameters.items())[1:]
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }


def _init_arguments(class_path: str) -> list[str]:
    """The arguments a config may give ``class_path`` (what the parser skips excluded)."""
    skipped = {"params", "optimizer"}  # filled in by the CLI: the model's parameters / optimizer
    return sorted(name for name in _init_parameters(class_path) if name not in skipped)


def _init_annotation(class_path: str, argument: str) -> str:
    """The declared type of ``argument``, resolved when the annotation is a string."""
    parameter = _init_parameters(class_path).get(argument)
    if parameter is None or parameter.annotation is inspect.Parameter.empty:
        return "another type"
    cls = _import_class(class_path)
    try:
        hints = typing.get_type_hints(cls.__init__) if cls is not None else {}
    except (NameError, TypeError, AttributeError, SyntaxError):  # show it as written
        hints = {}
    return describe_type(hints.get(argument, parameter.annotation))


def _public_path(cls: type) -> str:
    """``trainer.callbacks.EarlyStopping`` rather than ``trainer.callbacks.early_stopping...``."""
    package = cls.__module__.rpartition(".")[0]
    if package:
        try:
            module = importlib.import_module(package)
        except ImportError:
            module = None
        if module is not None and cls.__name__ in getattr(module, "__all__", ()):
            return f"{package}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _one_line(text: str) -> str:
    """jsonargparse's messages span several lines; the CLI's error contract is one line."""
    return " ".join(text.split())
