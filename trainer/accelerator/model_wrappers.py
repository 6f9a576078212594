"""What preparing a model wraps its forward in, besides the engine: autocast.

`AutocastForward` runs a model's forward under the precision plugin's autocast (mixed modes),
kept as an object so ``unwrap_model(keep_fp32_wrapper=False)`` can take it off again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.precision import Precision

__all__ = ["AutocastForward"]


class AutocastForward:
    """A model's forward run under the precision plugin's autocast (kept unwrappable)."""

    def __init__(self, original: Callable[..., Any], precision: Precision) -> None:
        self.original = original
        self.precision = precision

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            return self.original(*args, **kwargs)
