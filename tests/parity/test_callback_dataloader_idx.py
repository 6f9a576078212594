"""Parity by difference: ``dataloader_idx`` in the callbacks' evaluation batch hooks, on
lightning.pytorch 2.6 and on trainer.

Lightning's ``Callback.on_validation_batch_start`` / ``_end``, ``on_test_batch_*`` and
``on_predict_batch_*`` end with ``dataloader_idx: int = 0``; a stage with several dataloaders
passes the index, one with a single dataloader passes none. A callback written against that
signature (overriding with the default and calling ``super()`` with the index) and a
``BasePredictionWriter`` over two predict loaders receive the same calls on both frameworks.
Lightning's run is the expected value.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet
from tests.parity.frameworks import regression as regression_class

_HOOKS = tuple(
    f"on_{stage}_batch_{moment}"
    for stage in ("validation", "test", "predict")
    for moment in ("start", "end")
)


def _callback(fw: Any, calls: list[Any]) -> Any:
    """Overrides each hook as a Lightning user writes it, and calls the base hook with the index."""

    def record(name: str) -> Any:
        def start(self, trainer_, module, batch, batch_idx, dataloader_idx=0):
            calls.append((name, trainer_.sanity_checking, batch_idx, dataloader_idx))
            base = getattr(super(Indexed, self), name)
            base(trainer_, module, batch, batch_idx, dataloader_idx=dataloader_idx)

        def end(self, trainer_, module, outputs, batch, batch_idx, dataloader_idx=0):
            calls.append((name, trainer_.sanity_checking, batch_idx, dataloader_idx))
            getattr(super(Indexed, self), name)(
                trainer_, module, outputs, batch, batch_idx, dataloader_idx
            )

        return start if name.endswith("start") else end

    Indexed = type("Indexed", (fw.Callback,), {name: record(name) for name in _HOOKS})
    return Indexed()


def _writer(fw: Any, calls: list[Any]) -> Any:
    class Writer(fw.callbacks.BasePredictionWriter):  # type: ignore[misc, name-defined]
        def write_on_batch_end(
            self, trainer_, module, prediction, batch_indices, batch, batch_idx, dataloader_idx
        ):
            calls.append(("write batch", list(batch_indices), batch_idx, dataloader_idx))

        def write_on_epoch_end(self, trainer_, module, predictions, batch_indices):
            shape = [len(item) if isinstance(item, list) else "item" for item in predictions]
            calls.append(("write epoch", shape, batch_indices))

    return Writer(write_interval="batch_and_epoch")


def _module(fw: Any) -> Any:
    class Multi(regression_class(fw.Module)):  # type: ignore[misc]
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("val_loss", self.loss(batch))

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("test_loss", self.loss(batch))

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.net(batch[0])

    return Multi()


def _run(fw: Any) -> list[Any]:
    calls: list[Any] = []
    callbacks = [_callback(fw, calls), _writer(fw, calls)]
    fit = fw.trainer(callbacks=callbacks, **quiet(max_epochs=1))
    module = _module(fw)
    two = [loader(4, seed=1), loader(6, seed=2)]
    fit.fit(module, loader(4), two)
    calls.append("validate, one loader")
    fit.validate(module, loader(4, seed=3), **fw.eval_options)
    calls.append("test, two loaders")
    fit.test(module, two, **fw.eval_options)
    calls.append("predict, two loaders")
    fit.predict(module, [loader(3, seed=4), loader(4, seed=5)])
    calls.append("predict, one loader")
    fit.predict(module, loader(4, seed=6))
    return calls


def test_eval_batch_hooks_receive_dataloader_idx_as_in_lightning() -> None:
    expected = _run(LIGHTNING)
    assert ("on_test_batch_end", False, 2, 1) in expected
    assert _run(TRAINER) == expected


@pytest.mark.parametrize("hook", _HOOKS)
def test_the_base_hooks_declare_dataloader_idx_0(hook: str) -> None:
    def parameters(fw: Any) -> list[tuple[str, Any]]:
        signature = inspect.signature(getattr(fw.Callback, hook))
        return [(name, p.default) for name, p in signature.parameters.items()][-2:]

    assert (
        parameters(TRAINER)
        == parameters(LIGHTNING)
        == [("batch_idx", inspect._empty), ("dataloader_idx", 0)]
    )
