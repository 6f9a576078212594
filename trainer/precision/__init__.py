"""How numbers are represented: one class per precision mode, and the name registry.

``resolve_precision("bf16")`` turns a user string (or a Precision instance) into a plugin.
"""

from __future__ import annotations

from trainer.errors import ConfigurationError, describe
from trainer.precision.fp8 import FP8Precision
from trainer.precision.modes import DoublePrecision, HalfPrecision, MixedPrecision
from trainer.precision.precision import Precision

__all__ = [
    "PRECISION_ALIASES",
    "PRECISION_NAMES",
    "DoublePrecision",
    "FP8Precision",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "resolve_precision",
]

PRECISION_NAMES = (
    "32-true",
    "64-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "fp8",
)
# Lightning's short names and Accelerate's ``mixed_precision`` values.
PRECISION_ALIASES = {
    "32": "32-true",
    "no": "32-true",
    "64": "64-true",
    "16": "16-mixed",
    "fp16": "16-mixed",
    "bf16": "bf16-mixed",
    "fp32": "32-true",
}


def resolve_precision(
    precision: str | int | Precision | None, *, argument: str = "precision"
) -> Precision:
    """Return the plugin for ``precision`` (a name, an alias, an int like 32, or an instance).

    Raises:
        ConfigurationError: for an unknown name, listing the valid ones.
    """
    if isinstance(precision, Precision):
        return precision
    if precision is None:
        return Precision()
    name = str(precision)
    name = PRECISION_ALIASES.get(name, name)
    if name == "32-true":
        return Precision()
    if name == "64-true":
        return DoublePrecision()
    if name in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(name)
    if name in ("16-true", "bf16-true"):
        return HalfPrecision(name)
    if name == "fp8":
        return FP8Precision()
    valid = ", ".join(repr(n) for n in (*PRECISION_NAMES, *PRECISION_ALIASES))
    raise ConfigurationError(
        f"{argument}={describe(precision)} is not a precision mode. Expected one of {valid}, "
        "or a trainer.precision.Precision instance."
    )
