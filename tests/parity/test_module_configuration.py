"""Parity by difference: ``configure_callbacks``, ``configure_gradient_clipping`` and a
``backward`` override on lightning.pytorch 2.6 and trainer.

``configure_callbacks``: a module's callbacks replace the Trainer's of the same class and join
the others, checkpoint callbacks last and the finders first; the early stop that follows, and
the list, are compared. ``configure_gradient_clipping``: an override that clips its own way (by
value, a threshold of its own), one that defers to the default with the Trainer's value, a
skipped step (``training_step`` returning None), and a value that contradicts the Trainer's.
``backward``: an override that doubles the gradients, under automatic optimization with
accumulation and through ``manual_backward`` with keywords. Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework, loader, quiet, regression

pytest.importorskip("lightning.pytorch")


def _names(callbacks: list[Any]) -> list[str]:
    return [type(c).__name__ for c in callbacks]


def _with_callbacks(framework: Framework, returned: Any) -> Any:
    class Configured(regression(framework.Module)):  # type: ignore[misc]
        lr = 0.05  # what LearningRateFinder tunes

        def configure_callbacks(self) -> Any:
            return returned

    return Configured()


def _marker(framework: Framework) -> type:
    return type("Marker", (framework.Callback,), {})


def test_configure_callbacks_as_in_lightning(tmp_path) -> None:
    seen = {}
    for framework in BOTH:
        cbs = framework.callbacks
        marker = _marker(framework)
        given = [
            cbs.ModelCheckpoint(dirpath=str(tmp_path / framework.name), monitor="val_loss"),
            cbs.EarlyStopping(monitor="val_loss", patience=50),
            marker(),
        ]
        module = _with_callbacks(
            framework,
            [cbs.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0), marker()],
        )
        run = framework.trainer(**quiet(max_epochs=6, callbacks=given, enable_checkpointing=True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(module, loader(16, batch_size=4), loader(8, seed=1, batch_size=4))
        stops = [c for c in run.callbacks if type(c).__name__ == "EarlyStopping"]
        seen[framework.name] = (
            _names(run.callbacks),
            [c.patience for c in stops],
            run.current_epoch,
            run.global_step,
        )
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][0] == ["EarlyStopping", "Marker", "ModelCheckpoint"]
    assert seen["trainer"][2] < 6  # the module's early stop (patience 0) ended the fit


def test_a_single_returned_callback_and_the_order_of_finders(tmp_path) -> None:
    seen = {}
    for framework in BOTH:
        cbs = framework.callbacks
        marker = _marker(framework)
        run = framework.trainer(
            **quiet(
                max_epochs=1,
                enable_checkpointing=True,
                callbacks=[marker(), cbs.ModelCheckpoint(dirpath=str(tmp_path / framework.name))],
            )
        )
        initial = _names(run.callbacks)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(
                _with_callbacks(framework, cbs.LearningRateFinder(num_training_steps=5)),
                loader(16, batch_size=4),
            )
        seen[framework.name] = (initial, _names(run.callbacks))
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][1] == ["LearningRateFinder", "Marker", "ModelCheckpoint"]


def _clipping(framework: Framework, calls: list[Any], how: str) -> Any:
    class Clipping(regression(framework.Module)):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 1:
                return None  # a skipped step: the hook is still called, as in Lightning
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x) * 50, y)

        def configure_gradient_clipping(
            self,
            optimizer: Any,
            gradient_clip_val: Any = None,
            gradient_clip_algorithm: Any = None,
        ) -> None:
            calls.append((self.trainer.global_step, gradient_clip_val))
            has_gradients = any(p.grad is not None for p in self.parameters())
            if how == "own":  # by value, its own threshold, after the first step
                if self.trainer.global_step > 0 and has_gradients:
                    self.clip_gradients(optimizer, 0.01, "value")
            elif how == "default" and has_gradients:
                super().configure_gradient_clipping(
                    optimizer, gradient_clip_val, gradient_clip_algorithm
                )
            elif how == "contradicts":  # another value than the Trainer's
                self.clip_gradients(optimizer, gradient_clip_val=0.123)

    return Clipping()


@pytest.mark.parametrize(
    ("how", "trainer_value"), [("own", None), ("default", 0.05), ("contradicts", 0.05)]
)
def test_configure_gradient_clipping_as_in_lightning(how: str, trainer_value: Any) -> None:
    seen = {}
    for framework in BOTH:
        calls: list[Any] = []
        module = _clipping(framework, calls, how)
        options = {} if trainer_value is None else {"gradient_clip_val": trainer_value}
        run = framework.trainer(**quiet(max_epochs=1, **options))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run.fit(module, loader(16, batch_size=4))
            outcome: Any = [p.detach().flatten().tolist() for p in module.parameters()]
        except Exception:
            outcome = "raised"
        seen[framework.name] = (calls, outcome)
    assert seen["trainer"] == seen["lightning"]
    if how == "contradicts":
        assert seen["trainer"][1] == "raised"
    else:
        assert len(seen["trainer"][0]) == 4  # every step, the skipped one included


def _custom_backward(framework: Framework, calls: list[Any], *, manual: bool) -> Any:
    class Doubled(regression(framework.Module)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = not manual

        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            calls.append(("backward", round(float(loss), 5), sorted(kwargs)))
            (loss * 2).backward(*args, **kwargs)  # a custom backward: twice the gradients

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self.loss(batch)
            if not manual:
                return loss
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss, retain_graph=True)
            optimizer.step()
            return None

    return Doubled()


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_backward_override_runs_as_in_lightning(manual: bool) -> None:
    seen = {}
    for framework in BOTH:
        calls: list[Any] = []
        module = _custom_backward(framework, calls, manual=manual)
        run = framework.trainer(**quiet(max_epochs=1, accumulate_grad_batches=1 if manual else 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(module, loader(16, batch_size=4))
        seen[framework.name] = (calls, [p.detach().flatten().tolist() for p in module.parameters()])
    assert seen["trainer"] == seen["lightning"]
    assert len(seen["trainer"][0]) == 4  # one per batch, with the kwargs manual_backward gave
