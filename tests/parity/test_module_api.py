"""Parity by difference: what a ported module and callback read and call, on lightning.pytorch 2.6
and trainer.

``self.dtype``, ``self.logger`` / ``self.loggers``, ``self.all_gather`` on one process,
``freeze`` / ``unfreeze``; manual optimization of a small GAN with two optimizers through
``toggle_optimizer`` / ``untoggle_optimizer`` and ``clip_gradients`` (by norm and by value); and
``trainer.training`` / ``validating`` / ``testing`` / ``predicting`` / ``evaluating`` /
``sanity_checking`` / ``state.fn`` / ``lightning_module`` in every hook of fit, test and predict.
Lightning's run is the expected value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, LIGHTNING, Framework, loader, quiet


def _fit(framework: Framework, module: Any, **options: Any) -> Any:
    fit = framework.trainer(**quiet(**options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit.fit(module, loader(16, batch_size=4), loader(8, seed=1, batch_size=4))
    return fit


def _attributes_module(framework: Framework) -> Any:
    class Attributes(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)
            self.seen: dict[str, Any] = {}

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            data = {"a": torch.ones(2), "b": [torch.zeros(1)]}
            gathered = self.all_gather(data)
            self.seen.update(
                dtype=self.dtype,
                logger=type(self.logger).__name__,
                loggers=[type(logger).__name__ for logger in self.loggers],
                gathered=(gathered["a"].shape, gathered["b"][0].shape),
            )
            return torch.nn.functional.mse_loss(self.net(x).float(), y.float())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Attributes()


@pytest.mark.parametrize("precision", ["32-true", "bf16-true", "64-true", "bf16-mixed"])
def test_dtype_loggers_and_all_gather_as_in_lightning(tmp_path, precision: str) -> None:
    seen = {}
    for framework in BOTH:
        module = _attributes_module(framework)
        logger = framework.loggers.CSVLogger(str(tmp_path / framework.name))
        _fit(framework, module, max_steps=1, precision=precision, logger=logger)
        seen[framework.name] = dict(module.seen, outside=module.dtype)
    assert seen["trainer"] == seen["lightning"]


def test_freeze_and_unfreeze_as_in_lightning() -> None:
    states = {}
    for framework in BOTH:
        module = _attributes_module(framework)
        module.freeze()
        frozen = (module.training, [p.requires_grad for p in module.parameters()])
        module.unfreeze()
        states[framework.name] = (frozen, module.training, [p.requires_grad for p in module.parameters()])  # fmt: skip
    assert states["trainer"] == states["lightning"]


def _gan(framework: Framework) -> Any:
    class Gan(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.generator = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))  # fmt: skip
            self.discriminator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))  # fmt: skip
            self.shared = torch.nn.Parameter(torch.ones(1))  # in both optimizers
            self.automatic_optimization = False
            self.requires_grad_seen: list[tuple[bool, bool, bool]] = []

        def training_step(self, batch: Any, batch_idx: int) -> None:
            real, _ = batch
            g_opt, d_opt = self.optimizers()
            noise = torch.randn(
                real.shape[0], 2, generator=torch.Generator().manual_seed(batch_idx)
            )
            self.toggle_optimizer(d_opt)
            self.requires_grad_seen.append(self._flags())
            fake = self.generator(noise).detach()
            d_loss = (self.discriminator(fake) - self.discriminator(real) * self.shared).mean()
            d_opt.zero_grad()
            self.manual_backward(d_loss)
            self.clip_gradients(d_opt, gradient_clip_val=0.01, gradient_clip_algorithm="value")
            d_opt.step()
            self.untoggle_optimizer(d_opt)
            with self.toggled_optimizer(g_opt):
                self.requires_grad_seen.append(self._flags())
                g_loss = -(self.discriminator(self.generator(noise)) * self.shared).mean()
                g_opt.zero_grad()
                self.manual_backward(g_loss)
                self.clip_gradients(g_opt, gradient_clip_val=0.05)
                g_opt.step()
            self.requires_grad_seen.append(self._flags())
            self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, on_epoch=True)

        def _flags(self) -> tuple[bool, bool, bool]:
            return (
                self.generator[0].weight.requires_grad,
                self.discriminator[0].weight.requires_grad,
                self.shared.requires_grad,
            )

        def configure_optimizers(self) -> Any:
            g_opt = torch.optim.SGD([*self.generator.parameters(), self.shared], lr=0.1)
            d_opt = torch.optim.SGD([*self.discriminator.parameters(), self.shared], lr=0.1)
            return g_opt, d_opt

    return Gan()


def test_manual_gan_with_toggled_optimizers_and_clipping_matches_lightning() -> None:
    runs = {}
    for framework in BOTH:
        module = _gan(framework)
        fit = _fit(framework, module, max_epochs=2, limit_val_batches=0)
        runs[framework.name] = (
            module.requires_grad_seen,
            {name: p.detach().clone() for name, p in module.named_parameters()},
            {k: round(float(v), 6) for k, v in sorted(fit.callback_metrics.items())},
            fit.global_step,
        )
    expected, actual = runs["lightning"], runs["trainer"]
    assert expected[0][:3] == [(False, True, True), (True, False, True), (True, True, True)]
    assert actual[0] == expected[0]
    for name, value in expected[1].items():
        assert torch.equal(actual[1][name], value), name
    assert actual[2:] == expected[2:]


_FLAGS = ("training", "validating", "testing", "predicting", "evaluating", "sanity_checking")
_HOOKS = (
    "setup", "on_fit_start", "on_sanity_check_start", "on_validation_start", "on_train_start",
    "on_train_batch_start", "on_train_batch_end", "on_validation_batch_start", "on_train_epoch_end", "on_train_end",
    "on_fit_end", "teardown", "on_test_start", "on_test_batch_start", "on_predict_start",
    "on_predict_batch_start",
)  # fmt: skip


def test_what_is_running_as_lightning_reports_it_in_every_hook() -> None:
    runs = {}
    for framework in BOTH:
        seen: list[tuple[Any, ...]] = []

        def record(where: str, fit: Any, seen: list[tuple[Any, ...]] = seen) -> None:
            flags = tuple(getattr(fit, name) for name in _FLAGS)
            if where.startswith("on_train_batch") or where == "after fit":
                flags += (fit.is_last_batch, fit.interrupted)
            seen.append((where, *flags, getattr(fit.state.fn, "value", fit.state.fn)))

        def hook(name: str) -> Any:
            return lambda self, running, *args, **kwargs: record(name, running)

        callback = type("Record", (framework.Callback,), {name: hook(name) for name in _HOOKS})()
        module = _attributes_module(framework)
        module.validation_step = lambda batch, batch_idx: None
        module.test_step = lambda batch, batch_idx: None
        module.predict_step = lambda batch, batch_idx: 1
        stopping = framework.callbacks.EarlyStopping("never_logged", check_on_train_epoch_end=False, strict=False)  # fmt: skip
        fit = framework.trainer(**quiet(max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                                        num_sanity_val_steps=1, callbacks=[callback, stopping]))  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit.fit(module, loader(8, batch_size=4), loader(8, batch_size=4))
            record("after fit", fit)
            assert fit.lightning_module is module
            assert fit.early_stopping_callback is stopping
            assert fit.early_stopping_callbacks == [stopping]
            fit.test(module, loader(4, batch_size=4), **framework.eval_options)
            record("after test", fit)
            fit.predict(module, loader(4, batch_size=4))
            record("after predict", fit)
        runs[framework.name] = seen
    assert runs["trainer"] == runs["lightning"]
    assert ("on_validation_batch_start", False, True, False, False, True, False, "fit") in runs[LIGHTNING.name]  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "limit_train_batches": 3,
            "limit_val_batches": 0.5,
            "limit_test_batches": 2,
            "limit_predict_batches": 0.25,
        },
        {"overfit_batches": 2},
        {"overfit_batches": 0.5},
        {"fast_dev_run": 3},
        {"limit_val_batches": 0},
    ],
)
def test_resolved_limits_and_machine_facts_as_in_lightning(options: dict[str, Any]) -> None:
    names = ["limit_train_batches", "limit_val_batches", "limit_test_batches"]
    names += ["limit_predict_batches", "node_rank", "num_devices", "num_nodes"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [framework.trainer(**quiet(**options)) for framework in BOTH]
    expected, actual = ([getattr(run, name) for name in names] for run in runs)
    assert actual == expected


def test_ckpt_path_names_the_checkpoint_each_call_restored(tmp_path) -> None:
    runs = {}
    for framework in BOTH:
        module = _attributes_module(framework)
        module.validation_step = lambda batch, batch_idx, m=module: m.log("val", float(batch_idx))
        module.test_step = lambda batch, batch_idx: None
        checkpoint = framework.callbacks.ModelCheckpoint(dirpath=str(tmp_path / framework.name), monitor="val")  # fmt: skip
        fit = framework.trainer(**quiet(max_epochs=2, enable_checkpointing=True, callbacks=[checkpoint]))  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit.fit(module, loader(8, batch_size=4), loader(8, batch_size=4))
            after_fit = fit.ckpt_path
            fit.test(module, loader(4, batch_size=4), ckpt_path="best", **framework.eval_options)
            after_best = fit.ckpt_path == checkpoint.best_model_path != ""
            fit.test(module, loader(4, batch_size=4), **framework.eval_options)
        runs[framework.name] = (after_fit, after_best, fit.ckpt_path)
    assert runs["trainer"] == runs["lightning"]
