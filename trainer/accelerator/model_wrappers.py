"""What preparing a model wraps it in, besides the engine: the strategy choice and autocast forward.

- `build_strategy`: the Strategy for ``Accelerator(strategy=..., cpu=...)``.
- `AutocastForward`: a model's forward run under the precision plugin's autocast, kept so
  ``unwrap_model(keep_fp32_wrapper=False)`` can take it off again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.precision import Precision
from trainer.strategies import Strategy, _auto_strategy_name, resolve_strategy

__all__ = ["AutocastForward", "build_strategy"]


def build_strategy(strategy: str | Strategy | None, cpu: bool) -> Strategy:
    """The strategy for ``strategy`` (auto: from the launcher's environment), on CPU if asked."""
    if isinstance(strategy, Strategy):
        return strategy
    name = _auto_strategy_name() if strategy in (None, "auto") else strategy
    if not cpu:
        return resolve_strategy(name)
    return resolve_strategy(
        name, **({"device": "cpu"} if name == "single" else {"accelerator": "cpu"})
    )


class AutocastForward:
    """A model's forward run under the precision plugin's autocast (kept unwrappable)."""

    def __init__(self, original: Callable[..., Any], precision: Precision) -> None:
        self.original = original
        self.precision = precision

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            return self.original(*args, **kwargs)
