"""Parity by difference: the fit loop's Lightning features, on lightning.pytorch 2.6 and trainer.

``min_epochs`` / ``min_steps`` against ``should_stop`` and EarlyStopping; an epoch skipped by
``on_train_batch_start`` returning -1; the ``lr_scheduler_step`` hook with every kind of
scheduler; LBFGS (``optimizer.step(closure)``) under automatic optimization; manual
optimization's ``optimizer.step()`` / ``step(closure)``; ``overfit_batches``;
``reload_dataloaders_every_n_epochs``; where a resumed run starts. Each scenario records the
hooks (with epoch and step), the steps and the learning rate on both frameworks; Lightning's run
is the expected value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, LIGHTNING, TRAINER, loader, quiet, recording_callback
from tests.parity.frameworks import regression as regression_class

_EPOCH_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_validation_end", "on_train_end")
_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
)


def _facts(fit: Any, module: Any) -> dict[str, Any]:
    return {
        "global_step": fit.global_step,
        "epoch": fit.current_epoch,
        "weight": [round(v, 5) for v in module.net.weight.detach().flatten().tolist()],
        "lr": round(fit.optimizers[0].param_groups[0]["lr"], 8),
    }


# ---- min_epochs / min_steps ---------------------------------------------------------------------
def _stop_requested_every_batch(fw: Any, **options: Any) -> tuple[list[Any], dict[str, Any]]:
    calls: list[Any] = []

    class AlwaysStop(regression_class(fw.Module)):  # type: ignore[misc]
        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.trainer.should_stop = True

    callback = recording_callback(fw.Callback, calls, _EPOCH_HOOKS)
    fit = fw.trainer(callbacks=[callback], **quiet(max_epochs=10, **options))
    module = AlwaysStop()
    fit.fit(module, loader(8), loader(4))
    return calls, _facts(fit, module)


@pytest.mark.parametrize(
    "options",
    [{"min_epochs": 3}, {"min_steps": 6}, {"min_epochs": 2, "min_steps": 3}, {}],
    ids=["min_epochs=3", "min_steps=6", "min_epochs=2+min_steps=3", "no minimum"],
)
def test_should_stop_waits_for_min_epochs_and_min_steps(options: dict[str, Any]) -> None:
    expected_calls, expected = _stop_requested_every_batch(LIGHTNING, **options)
    calls, facts = _stop_requested_every_batch(TRAINER, **options)
    if expected["global_step"] % 4:  # stopped inside an epoch
        # Deliberate difference (docs/migration/lightning.md): Lightning counts the interrupted
        # epoch as done; trainer's current_epoch stays on it (a resume continues it).
        assert (facts["epoch"], expected["epoch"]) == (expected["epoch"] - 1, expected["epoch"])
        expected["epoch"] -= 1
        calls[-1] = (*calls[-1][:1], calls[-1][1] + 1, *calls[-1][2:])  # on_train_end's epoch
    assert calls == expected_calls
    assert facts == expected


def _early_stopping_run(fw: Any, min_epochs: int) -> tuple[list[Any], dict[str, Any]]:
    calls: list[Any] = []
    stopping = fw.callbacks.EarlyStopping(monitor="val_loss", mode="max", patience=0)
    recorder = recording_callback(fw.Callback, calls, _EPOCH_HOOKS)
    fit = fw.trainer(callbacks=[recorder, stopping], **quiet(max_epochs=8, min_epochs=min_epochs))
    module = regression_class(fw.Module)()
    fit.fit(module, loader(8), loader(4, seed=1))
    return calls, _facts(fit, module)


@pytest.mark.parametrize("min_epochs", [0, 4])
def test_early_stopping_cannot_stop_before_min_epochs(min_epochs: int) -> None:
    """val_loss falls every epoch, so EarlyStopping(mode="max", patience=0) asks to stop at once."""
    assert _early_stopping_run(TRAINER, min_epochs) == _early_stopping_run(LIGHTNING, min_epochs)


# ---- on_train_batch_start returning -1; lr_scheduler_step -----------------------------------
def _scheduling_module(fw: Any, calls: list[Any], recipe: str) -> Any:
    class Scheduling(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train_loss", loss)
            return loss

        def on_train_batch_start(self, batch, batch_idx):
            calls.append(("m:on_train_batch_start", self.current_epoch, batch_idx))
            if recipe == "skip" and self.current_epoch == 1 and batch_idx == 2:
                return -1
            return None

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            lr = torch.optim.lr_scheduler
            schedulers: list[dict[str, Any]] = [
                {"scheduler": lr.StepLR(optimizer, 1, 0.9), "interval": "epoch"},
                {"scheduler": lr.ExponentialLR(optimizer, 0.95), "interval": "step"},
            ]
            if recipe == "all kinds":
                schedulers[1]["frequency"] = 3
                schedulers += [
                    {
                        "scheduler": lr.ReduceLROnPlateau(optimizer, patience=0),
                        "monitor": "val_loss",
                    },
                    {
                        "scheduler": lr.ReduceLROnPlateau(optimizer, patience=0, factor=0.8),
                        "monitor": "train_loss",
                        "interval": "step",
                        "frequency": 2,
                    },
                ]
            return [optimizer], schedulers

        def lr_scheduler_step(self, scheduler, metric):
            value = None if metric is None else round(float(metric), 5)
            name = type(scheduler).__name__
            calls.append(("m:lr_scheduler_step", name, self.current_epoch, self.global_step, value))
            super().lr_scheduler_step(scheduler, metric)

    return Scheduling()


def _scheduling_run(fw: Any, recipe: str, **options: Any) -> tuple[list[Any], dict[str, Any]]:
    calls: list[Any] = []
    recorder = recording_callback(fw.Callback, calls, (*_EPOCH_HOOKS, "on_validation_start"))
    fit = fw.trainer(callbacks=[recorder], **quiet(max_epochs=3, **options))
    module = _scheduling_module(fw, calls, recipe)
    fit.fit(module, loader(10), loader(4, seed=1))
    return calls, _facts(fit, module)


@pytest.mark.parametrize(
    ("recipe", "options"),
    [
        ("skip", {}),
        ("skip", {"accumulate_grad_batches": 2, "num_sanity_val_steps": 0}),
        ("all kinds", {}),
        ("all kinds", {"accumulate_grad_batches": 2, "val_check_interval": 0.2}),
    ],
    ids=["skipped epoch", "skipped epoch, accumulation", "schedulers", "schedulers, accumulation"],
)
def test_schedulers_step_through_lr_scheduler_step_as_in_lightning(
    recipe: str, options: dict[str, Any]
) -> None:
    """The hook receives each step (metric for ReduceLROnPlateau) at Lightning's moments; an
    epoch skipped by on_train_batch_start -> -1 does not validate, and counts as complete."""
    assert _scheduling_run(TRAINER, recipe, **options) == _scheduling_run(
        LIGHTNING, recipe, **options
    )


# ---- LBFGS: optimizer.step(closure) --------------------------------------------------------
def _lbfgs_run(fw: Any, **options: Any) -> tuple[list[Any], dict[str, Any]]:
    calls: list[Any] = []

    class WithLBFGS(regression_class(fw.Module, calls)):  # type: ignore[misc]
        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)

    recorder = recording_callback(fw.Callback, calls, (*_EPOCH_HOOKS, *_BATCH_HOOKS))
    fit = fw.trainer(callbacks=[recorder], **quiet(max_epochs=2, gradient_clip_val=5.0, **options))
    module = WithLBFGS()
    fit.fit(module, loader(6), loader(4))
    return calls, _facts(fit, module)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lbfgs_reevaluates_through_its_closure_as_in_lightning(accumulate: int) -> None:
    """Each evaluation LBFGS asks for runs training_step, zero_grad, backward and
    on_before_optimizer_step again, as Lightning's closure does."""
    expected = _lbfgs_run(LIGHTNING, accumulate_grad_batches=accumulate)
    assert expected[0].count("m:training_step") > 6 * 2, "LBFGS did not re-evaluate"
    assert _lbfgs_run(TRAINER, accumulate_grad_batches=accumulate) == expected


def _manual_run(fw: Any, recipe: str) -> tuple[list[Any], dict[str, Any]]:
    calls: list[Any] = []

    class Manual(regression_class(fw.Module)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            optimizer.zero_grad()
            if recipe == "step()":
                self.manual_backward(self.loss(batch))
                optimizer.step()
                return

            def closure():
                calls.append("closure")
                optimizer.zero_grad()
                loss = self.loss(batch)
                self.manual_backward(loss)
                return loss

            returned = optimizer.step(closure=closure)
            calls.append(("step returned", round(float(returned), 5)))

        def configure_optimizers(self):
            if recipe == "LBFGS":
                return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)
            return torch.optim.SGD(self.parameters(), lr=0.05)

    recorder = recording_callback(fw.Callback, calls, _BATCH_HOOKS)
    fit = fw.trainer(callbacks=[recorder], **quiet(max_epochs=2))
    module = Manual()
    fit.fit(module, loader(6))
    return calls, _facts(fit, module)


@pytest.mark.parametrize("recipe", ["step()", "step(closure)", "LBFGS"])
def test_manual_optimizer_step_runs_the_hook_and_the_closure(recipe: str) -> None:
    """Manual optimization: optimizer.step() runs on_before_optimizer_step, after the closure
    when one is given (LBFGS runs it for each evaluation), and returns its first result."""
    assert _manual_run(TRAINER, recipe) == _manual_run(LIGHTNING, recipe)


# ---- overfit_batches --------------------------------------------------------------------------
def _overfit_run(fw: Any, overfit: int | float) -> tuple[list[Any], dict[str, Any]]:
    seen: list[Any] = []

    class Recording(regression_class(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            seen.append(("train", self.current_epoch, batch_idx, round(float(batch[0].sum()), 4)))
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            seen.append(("val", self.current_epoch, batch_idx, round(float(batch[0].sum()), 4)))
            self.log("val_loss", self.loss(batch))

    torch.manual_seed(1)  # the shuffled loaders' order, were shuffling kept
    fit = fw.trainer(**quiet(max_epochs=3, overfit_batches=overfit))
    module = Recording()
    fit.fit(module, loader(8, shuffle=True), loader(8, seed=1, shuffle=True))
    return seen, _facts(fit, module)


@pytest.mark.parametrize("overfit", [2, 0.5])
def test_overfit_batches_reads_the_same_first_batches_every_epoch(overfit: int | float) -> None:
    with pytest.warns(UserWarning, match="shuffl"):
        received = _overfit_run(TRAINER, overfit)
    assert received == _overfit_run(LIGHTNING, overfit)


# ---- reload_dataloaders_every_n_epochs ------------------------------------------------------
def _reload_run(fw: Any, **options: Any) -> tuple[dict[str, list[int]], dict[str, Any]]:
    requests: dict[str, list[int]] = {"train": [], "val": []}

    class Reloading(regression_class(fw.Module)):  # type: ignore[misc]
        def train_dataloader(self):
            requests["train"].append(self.current_epoch)
            return loader(6, seed=len(requests["train"]))  # new data with each request

        def val_dataloader(self):
            requests["val"].append(self.current_epoch)
            return loader(4, seed=100 + len(requests["val"]))

    fit = fw.trainer(**quiet(max_epochs=5, reload_dataloaders_every_n_epochs=2, **options))
    module = Reloading()
    fit.fit(module)
    return requests, _facts(fit, module)


@pytest.mark.parametrize(
    "options",
    [{}, {"check_val_every_n_epoch": 2}, {"num_sanity_val_steps": 0}],
    ids=["every epoch", "validation every 2nd epoch", "no sanity check"],
)
def test_reload_dataloaders_every_n_epochs(options: dict[str, Any]) -> None:
    """At which epochs each loader is requested again, and the training that gives. (The first
    train_dataloader() call comes before the sanity check here, after it in Lightning: a resume
    restores the loader's position at setup. Each stage's requests are compared on their own.)"""
    assert _reload_run(TRAINER, **options) == _reload_run(LIGHTNING, **options)


# ---- where a resumed run starts ----------------------------------------------------------------
def _resumed_run(
    fw: Any, folder: Path, saved_at: str, *, has_val: bool, **resume_options: Any
) -> list[Any]:
    """Train 2 epochs saving checkpoints, then resume a new run from the one ``saved_at``."""
    every = {
        "validation end": {},
        "mid-epoch": {"every_n_train_steps": 2},
        "mid-epoch validation": {"monitor": "val_loss"},  # saved after each validation
    }[saved_at]
    if saved_at == "mid-epoch validation":
        every.update(save_top_k=-1)
    checkpoint = fw.callbacks.ModelCheckpoint(
        dirpath=folder, **{"save_top_k": -1, "monitor": None, **every}
    )
    options = quiet(max_epochs=2, num_sanity_val_steps=0, enable_checkpointing=True)
    options["default_root_dir"] = str(folder / "root")  # the resumed run's default checkpoints
    val = loader(4, seed=1) if has_val else None
    interval = {"val_check_interval": 0.5} if saved_at == "mid-epoch validation" else {}
    first = fw.trainer(callbacks=[checkpoint], **options, **interval)
    first.fit(regression_class(fw.Module)(), loader(8), val)
    step = {"validation end": 4, "mid-epoch": 2, "mid-epoch validation": 4}[saved_at]
    path = next(folder.glob(f"epoch=0-step={step}*"))
    calls: list[Any] = []
    hooks = (*_EPOCH_HOOKS, "on_train_start", "on_sanity_check_start")
    recorder = recording_callback(fw.Callback, calls, hooks)
    fit = fw.trainer(callbacks=[recorder], **{**options, **interval, **resume_options})
    fit.fit(regression_class(fw.Module)(), loader(8), val, ckpt_path=str(path))
    return calls


@pytest.mark.parametrize(
    ("saved_at", "has_val"),
    [("validation end", True), ("validation end", False), ("mid-epoch", True)],
    ids=["at validation end", "at on_train_epoch_end", "mid-epoch"],
)
def test_resumed_run_starts_where_lightning_starts(
    tmp_path: Path, saved_at: str, has_val: bool
) -> None:
    """A checkpoint taken once the epoch's batches and validation were done resumes at the next
    epoch without on_train_epoch_end again; a mid-epoch one continues its epoch."""
    expected = _resumed_run(LIGHTNING, tmp_path / "lightning", saved_at, has_val=has_val)
    received = _resumed_run(TRAINER, tmp_path / "trainer", saved_at, has_val=has_val)
    if saved_at == "mid-epoch":
        # Deliberate difference (docs/migration/lightning.md): the resumed epoch runs
        # on_train_epoch_start, where callbacks set up per-epoch state; Lightning skips it.
        assert received.pop(1) == ("on_train_epoch_start", 0, 2)
    assert received == expected


def test_both_frameworks_are_compared() -> None:
    assert [fw.name for fw in BOTH] == ["lightning", "trainer"]


@pytest.mark.parametrize(
    ("saved_at", "resume_options"),
    [
        ("validation end", {}),  # saved in on_train_epoch_end: a finished epoch, sanity check
        ("validation end", {"max_steps": 12}),  # Lightning: max_steps set, no sanity check
        ("mid-epoch", {}),  # inside the epoch: no sanity check
        ("mid-epoch validation", {}),  # after the epoch's last validation, before its end
    ],
    ids=["finished epoch", "finished epoch, max_steps", "mid-epoch", "after last validation"],
)
def test_resumed_run_sanity_checks_where_lightning_does(
    tmp_path: Path, saved_at: str, resume_options: dict[str, Any]
) -> None:
    """Lightning skips the sanity check of a resumed fit whose loops are "restarting": the
    checkpoint was taken inside an epoch (before ``on_train_epoch_end``), or ``max_steps`` is
    set. trainer ran it on every resume (hooks a callback sees twice, time spent)."""
    options = {"has_val": True, "num_sanity_val_steps": 2, **resume_options}
    expected = _resumed_run(LIGHTNING, tmp_path / "lightning", saved_at, **options)
    received = _resumed_run(TRAINER, tmp_path / "trainer", saved_at, **options)
    sanity = [call for call in expected if call[0] == "on_sanity_check_start"]
    assert [call for call in received if call[0] == "on_sanity_check_start"] == sanity
    assert bool(sanity) == (saved_at == "validation end" and not resume_options)
    if resume_options:
        # Lightning, "restarting" from a finished epoch, runs that epoch's on_train_epoch_end
        # again and stops without a step (global_step 4 at on_train_end); trainer trains on.
        assert expected[-1] == ("on_train_end", 2, 4) and received[-1] == ("on_train_end", 2, 8)
        return
    if saved_at.startswith("mid-epoch"):  # the deliberate difference of the test above
        assert received.pop(1) == ("on_train_epoch_start", 0, 2 if saved_at == "mid-epoch" else 4)
    assert received == expected
