"""Which of a ModelCheckpoint's files a tracker (W&B, MLflow) uploads next.

Reads only the callback's public ``best_k_models`` / ``best_model_path`` / ``last_model_path``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["checkpoints_to_log"]


def checkpoints_to_log(
    checkpoint_callback: Any, logged: Mapping[str, float]
) -> list[tuple[str, float | None, list[str]]]:
    """``(path, score, aliases)`` of the callback's checkpoints that are new or rewritten.

    Reads the public ``best_k_models`` / ``best_model_path`` / ``last_model_path`` of a
    ModelCheckpoint; oldest first, so the newest upload ends up with the ``latest`` alias.
    """
    scores: dict[str, float | None] = {
        str(path): float(score)
        for path, score in getattr(checkpoint_callback, "best_k_models", {}).items()
    }
    for path in (
        getattr(checkpoint_callback, "best_model_path", ""),
        getattr(checkpoint_callback, "last_model_path", ""),
    ):
        if path:
            scores.setdefault(str(path), None)
    best = getattr(checkpoint_callback, "best_model_path", "")
    found = []
    for path, score in scores.items():
        if not os.path.exists(path):
            continue  # pruned since it was saved
        mtime = os.path.getmtime(path)
        if logged.get(path) != mtime:
            found.append((mtime, path, score))
    found.sort()
    return [
        (path, score, ["latest", "best"] if path == best else ["latest"])
        for _, path, score in found
    ]
