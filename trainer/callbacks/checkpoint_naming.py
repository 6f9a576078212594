"""How ModelCheckpoint names a checkpoint: the template, the values it reads, version suffixes.

This module owns filling a ``filename`` template (``{epoch}``, ``{step}`` and metric fields with
format specs, Lightning's ``auto_insert_metric_name``), the values a template and ``monitor``
read (``trainer.callback_metrics`` with ``epoch`` and ``step`` as ints, Lightning's
``_monitor_candidates``), and the first free name among ``name``, ``name-v1``, ``name-v2``, ...
(``enable_version_counter``). It does not decide when to save or what to keep
(``model_checkpoint.py``), nor what may be replaced on disk (``checkpoint_folder.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.callbacks.checkpoint_folder import is_link_left_behind
from trainer.checkpoint.atomic import unlisted_files
from trainer.errors import ConfigurationError

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = ["fill_template", "first_free_name", "is_taken_last", "monitor_candidates"]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


def monitor_candidates(trainer: Trainer) -> dict[str, Any]:
    """``trainer.callback_metrics`` plus ``epoch`` and ``step`` as ints (logged values win).

    Examples:
        >>> monitor_candidates(trainer)  # epoch 2, 40 optimizer steps, val/loss logged
        {'val/loss': tensor(0.1234), 'epoch': 2, 'step': 40}
    """
    metrics: dict[str, Any] = dict(trainer.callback_metrics)
    for name, default in (("epoch", trainer.current_epoch), ("step", trainer.global_step)):
        value = metrics.get(name)
        metrics[name] = int(value) if isinstance(value, torch.Tensor) else default
    return metrics


def fill_template(template: str, values: dict[str, Any], *, auto_insert_metric_name: bool) -> str:
    """``template`` with each ``{name}`` / ``{name:spec}`` replaced by its value.

    A bare field becomes ``name=value`` when ``auto_insert_metric_name`` (unless the template
    already writes ``name=`` before it); "/" in the result becomes "_" (no sub-folders).

    Raises:
        ConfigurationError: a field is neither epoch, step nor a logged metric.

    Examples:
        >>> fill_template("{epoch}-{val/loss:.2f}", {"epoch": 2, "val/loss": 0.1234},
        ...               auto_insert_metric_name=True)
        'epoch=2-val_loss=0.12'
    """

    def fill(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2) or ""
        if name not in values:
            raise ConfigurationError(
                f"ModelCheckpoint(filename={template!r}): {{{name}}} is neither epoch, step nor "
                f"a logged metric ({sorted(values)}). Log it with self.log(...) or change filename."
            )
        value = values[name]
        if isinstance(value, torch.Tensor):
            value = value.item()
        text = format(value, spec[1:]) if spec else str(value)
        prefix = match.string[max(0, match.start() - len(name) - 1) : match.start()]
        is_named = prefix == f"{name}="
        return f"{name}={text}" if auto_insert_metric_name and not is_named else text

    return _FIELD.sub(fill, template).replace("/", "_")


def first_free_name(
    name_for: Callable[[int | None], str],
    is_taken: Callable[[str], bool],
    reusable: str = "",
    first_version: int = 1,
) -> str:
    """``name_for(None)``, else ``name_for(1)``, ``name_for(2)``, ...: the first not taken or
    equal to ``reusable`` (the checkpoint this save replaces, Lightning's ``del_filepath``) —
    unless a user added files to ``reusable`` (`unlisted_files`): it is then kept, and taken.

    Examples:
        >>> first_free_name(lambda v: "model" if v is None else f"model-v{v}",
        ...                 lambda name: name in {"model", "model-v1"})
        'model-v2'
    """
    if reusable and unlisted_files(reusable):
        reusable = ""
    name, version = name_for(None), first_version
    while name != reusable and is_taken(name):
        name, version = name_for(version), version + 1
    return name


def is_taken_last(path: str) -> bool:
    """Whether ``path`` is taken for ``last``: a link or flattened link there (how earlier
    versions kept ``last``) is replaced, so it does not take the name."""
    return os.path.lexists(path) and not is_link_left_behind(Path(path))
