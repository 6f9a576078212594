"""Train / eval modes, as Lightning 2.6 handles them.

Training never sets modes: a submodule the user put in eval mode (a frozen backbone whose
BatchNorm statistics must not move) stays so, and ``fit`` warns once when it starts with such
modules, as Lightning does. An evaluation (validation, test, predict, the sanity check) records
the mode of every submodule, calls the module's ``on_<stage>_model_eval`` hook (default:
``eval()``), and at its end restores each recorded mode — or, when the module overrides
``on_validation_model_train`` / ``on_test_model_train``, calls that instead. Before a validation
inside ``fit`` that does not cut an accumulation window, ``on_validation_model_zero_grad``
(default: ``zero_grad()``) frees the gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer._warnings import warn_user
from trainer.trainer.log_refusal import refusing_logs

__all__ = [
    "ModeHooks",
    "capture_modes",
    "put_modes",
    "restore_modes",
    "switch_to_eval",
    "warn_on_eval_modules",
]

_EVAL_HOOK = {
    "validation": "on_validation_model_eval",
    "test": "on_test_model_eval",
    "predict": "on_predict_model_eval",
}
_TRAIN_HOOK = {"validation": "on_validation_model_train", "test": "on_test_model_train"}


class ModeHooks:
    """The mode hooks' defaults, for `trainer.TrainModule`."""

    trainer: Any

    def _evaluated_model(self) -> torch.nn.Module:
        model = self.trainer.model
        return model if model is not None else self  # type: ignore[return-value]

    def on_validation_model_zero_grad(self) -> None:
        """Before a validation inside ``fit``: free the gradients (``zero_grad()``)."""
        self.zero_grad()  # type: ignore[attr-defined]

    def on_validation_model_eval(self) -> None:
        """At the start of a validation: ``eval()`` on the model."""
        self._evaluated_model().eval()

    def on_validation_model_train(self) -> None:
        """At the end of a validation, when overridden (else each submodule's mode is restored);
        the default sets train mode."""
        self._evaluated_model().train()

    def on_test_model_eval(self) -> None:
        """At the start of a test: ``eval()`` on the model."""
        self._evaluated_model().eval()

    def on_test_model_train(self) -> None:
        """At the end of a test, when overridden (else each submodule's mode is restored)."""
        self._evaluated_model().train()

    def on_predict_model_eval(self) -> None:
        """At the start of a predict: ``eval()`` on the model."""
        self._evaluated_model().eval()


def _is_overridden(module: object, name: str) -> bool:
    return name in vars(module) or getattr(type(module), name) is not getattr(ModeHooks, name)


def capture_modes(module: torch.nn.Module) -> dict[str, bool]:
    """Every submodule's mode (``training``), by name."""
    return {name: sub.training for name, sub in module.named_modules()}


def put_modes(module: torch.nn.Module, modes: dict[str, bool]) -> None:
    """Give each submodule its recorded mode (one made since keeps its own)."""
    for name, sub in module.named_modules():
        if name in modes:
            sub.training = modes[name]


def switch_to_eval(module: Any, stage: str) -> dict[str, bool]:
    """Record every submodule's mode, then run ``stage``'s eval hook; return the record."""
    modes = capture_modes(module)
    hook = _EVAL_HOOK[stage]
    refusing_logs(getattr(module, hook), module, hook)()
    return modes


def restore_modes(module: Any, stage: str, modes: dict[str, bool]) -> None:
    """End of an evaluation: the module's overridden train hook, else the recorded modes."""
    hook = _TRAIN_HOOK.get(stage)
    if hook is not None and _is_overridden(module, hook):
        refusing_logs(getattr(module, hook), module, hook)()
    else:
        put_modes(module, modes)


def warn_on_eval_modules(module: torch.nn.Module) -> None:
    """Lightning's warning when ``fit`` starts with submodules in eval mode."""
    in_eval = [name for name, sub in module.named_modules() if not sub.training]
    if in_eval:
        warn_user(
            f"Found {len(in_eval)} module(s) in eval mode at the start of training: "
            f"{in_eval[:5]}{' ...' if len(in_eval) > 5 else ''}. They stay in eval mode (their "
            "dropout is off and their BatchNorm statistics do not move), as in Lightning; call "
            ".train() on them if that is not intended."
        )
