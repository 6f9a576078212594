"""Trainer behaviour on one CPU: stopping, accumulation, clipping, schedulers, validation cadence."""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from pathlib import Path

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback


def test_fit_trains_and_reduces_loss(tmp_path):
    module = LinearModule(lr=0.1)
    loader = make_loader(n=64, batch_size=8)
    t = quiet_trainer(tmp_path, max_epochs=5)
    before = t.validate(module, loader)[0]["val/loss"]
    t.fit(module, loader, loader)
    after = t.callback_metrics["val/loss"].item()
    assert after < before * 0.1
    assert t.global_step == 40 and t.current_epoch == 5
    assert t.state.status == "finished" and t.state.stage == "fit"


def test_max_steps_stops_mid_epoch(tmp_path):
    t = quiet_trainer(tmp_path, max_steps=5)
    t.fit(LinearModule(), make_loader(n=32, batch_size=4))
    assert t.global_step == 5


def test_max_epochs_none_and_max_steps_default_to_1000_epochs(tmp_path):
    assert quiet_trainer(tmp_path).max_epochs == 1000
    assert quiet_trainer(tmp_path, max_steps=3).max_epochs == -1


def test_max_time_stops_training(tmp_path):
    t = quiet_trainer(tmp_path, max_epochs=1000, max_time=dt.timedelta(seconds=0))
    t.fit(LinearModule(), make_loader(n=8, batch_size=4))
    assert t.global_step == 0  # already over time before the first epoch
    t = quiet_trainer(tmp_path, max_epochs=1000, max_time="00:00:00:01")
    assert t.max_time == dt.timedelta(seconds=1)


def test_should_stop_from_a_callback_ends_after_the_batch(tmp_path):
    class StopAt3(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                trainer.should_stop = True

    t = quiet_trainer(tmp_path, max_epochs=10, callbacks=[StopAt3()])
    t.fit(LinearModule(), make_loader(n=32, batch_size=4))
    # The stopped epoch is not complete: it keeps its position, so a resume continues inside it.
    assert t.global_step == 3 and t.current_epoch == 0 and t.progress.batch_idx == 3


def _accumulated_reference(accumulate: int, epochs: int, loader) -> list[torch.Tensor]:
    torch.manual_seed(0)
    module = LinearModule(lr=0.05)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    batches = list(loader)
    for _ in range(epochs):
        for index, (x, y) in enumerate(batches):
            loss = torch.nn.functional.mse_loss(module(x), y) / accumulate
            loss.backward()
            if (index + 1) % accumulate == 0 or index + 1 == len(batches):
                optimizer.step()
                optimizer.zero_grad()
    return [p.detach().clone() for p in module.parameters()]


def test_accumulation_matches_a_hand_written_loop(tmp_path):
    loader = make_loader(n=20, batch_size=4)  # 5 batches: windows of 2, 2, 1
    expected = _accumulated_reference(2, 2, loader)
    torch.manual_seed(0)
    module = LinearModule(lr=0.05)
    t = quiet_trainer(tmp_path, max_epochs=2, accumulate_grad_batches=2)
    t.fit(module, loader)
    assert t.global_step == 6
    for got, want in zip(module.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-7)


class _GradProbe(Callback):
    def __init__(self):
        self.norms: list[float] = []
        self.max_abs: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # Gradients stay on the parameters after the step (Lightning's order): the clipped ones.
        grads = [p.grad for p in module.parameters()]
        self.norms.append(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item())
        self.max_abs.append(max(g.abs().max().item() for g in grads))


def test_gradient_clip_by_norm_and_by_value(tmp_path):
    probe = _GradProbe()
    quiet_trainer(tmp_path, max_steps=4, gradient_clip_val=0.5, callbacks=[probe]).fit(
        LinearModule(), make_loader()
    )
    assert max(probe.norms) <= 0.5 + 1e-5
    probe = _GradProbe()
    quiet_trainer(
        tmp_path,
        max_steps=4,
        gradient_clip_val=0.01,
        gradient_clip_algorithm="value",
        callbacks=[probe],
    ).fit(LinearModule(), make_loader())
    assert max(probe.max_abs) <= 0.01 + 1e-7
    unclipped = _GradProbe()
    quiet_trainer(tmp_path, max_steps=4, callbacks=[unclipped]).fit(LinearModule(), make_loader())
    assert max(unclipped.norms) > 0.5  # so the clipping above really did something


class _SchedModule(LinearModule):
    def __init__(self, form: str) -> None:
        super().__init__(lr=1.0)
        self.form = form

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if self.form == "tuple":
            return [opt], [sched]
        if self.form == "step":
            return {
                "optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 2},
            }
        if self.form == "list_of_dicts":
            return [{"optimizer": opt, "lr_scheduler": sched}]
        return {"optimizer": opt, "lr_scheduler": sched}


@pytest.mark.parametrize(
    ("form", "expected_lr"),
    [("tuple", 0.5**3), ("dict", 0.5**3), ("list_of_dicts", 0.5**3), ("step", 0.5**6)],
)
def test_scheduler_forms_and_intervals(tmp_path, form, expected_lr):
    module = _SchedModule(form)
    t = quiet_trainer(tmp_path, max_epochs=3)
    t.fit(module, make_loader(n=16, batch_size=4))
    # 3 epochs x 4 steps; epoch interval -> 3 decays; step interval every 2 steps -> 6 decays.
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected_lr)
    assert module.lr_schedulers() is t.lr_scheduler_configs[0].scheduler


def test_reduce_lr_on_plateau_reads_the_monitored_metric(tmp_path):
    class Plateau(LinearModule):
        def validation_step(self, batch, batch_idx):
            self.log("val/const", 1.0)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.1)
            return {
                "optimizer": opt,
                "lr_scheduler": {"scheduler": plateau, "monitor": "val/const"},
            }

    t = quiet_trainer(tmp_path, max_epochs=3)
    t.fit(Plateau(), make_loader(n=8), make_loader(n=8))
    # epoch 0 sets the best value; epochs 1 and 2 do not improve -> two reductions.
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01)


def test_reduce_lr_on_plateau_missing_metric_names_the_logged_ones(tmp_path):
    class Plateau(LinearModule):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            return {
                "optimizer": opt,
                "lr_scheduler": {
                    "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                    "monitor": "nope",
                },
            }

    with pytest.raises(trainer.ConfigurationError, match=r"'nope'.*logged metrics.*val/loss"):
        quiet_trainer(tmp_path, max_epochs=1).fit(Plateau(), make_loader(n=8), make_loader(n=8))


class _ValCounter(Callback):
    def __init__(self):
        self.val_steps: list[int] = []

    def on_validation_start(self, trainer, module):
        if not trainer.sanity_checking:
            self.val_steps.append(trainer.global_step)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"val_check_interval": 0.5}, [2, 4, 6, 8]),
        ({"val_check_interval": 1}, [1, 2, 3, 4, 5, 6, 7, 8]),
        ({"val_check_interval": 3}, [3, 7]),  # Lightning: no extra one at the epoch's end
        ({"check_val_every_n_epoch": 2}, [8]),
    ],
)
def test_validation_cadence(tmp_path, kwargs, expected):
    counter = _ValCounter()
    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[counter], **kwargs)
    t.fit(LinearModule(), make_loader(n=16, batch_size=4), make_loader(n=8))
    assert counter.val_steps == expected


def test_val_check_interval_larger_than_epoch_is_rejected(tmp_path):
    with pytest.raises(trainer.ConfigurationError, match="val_check_interval=10"):
        quiet_trainer(tmp_path, max_epochs=1, val_check_interval=10).fit(
            LinearModule(), make_loader(n=16), make_loader(n=8)
        )


def test_sanity_check_runs_n_batches_and_its_metrics_are_discarded(tmp_path):
    seen: list[tuple[bool, int]] = []

    class Probe(Callback):
        def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append((trainer.sanity_checking, batch_idx))

        def on_sanity_check_end(self, trainer, module):
            seen.append(("metrics", "val/loss" in trainer.callback_metrics))

    t = quiet_trainer(
        tmp_path, max_epochs=1, num_sanity_val_steps=2, callbacks=[Probe()], limit_train_batches=0
    )
    t.fit(LinearModule(), make_loader(n=16), make_loader(n=16))
    assert seen[:2] == [(True, 0), (True, 1)]
    assert [s for s in seen if s[0] is True] == [(True, 0), (True, 1)]


def test_limits_int_and_fraction(tmp_path):
    t = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=0.5, limit_val_batches=1)
    counter = _ValCounter()
    t.callbacks.append(counter)
    t.fit(LinearModule(), make_loader(n=32, batch_size=4), make_loader(n=32, batch_size=4))
    assert t.global_step == 4 and t.num_training_batches == 4 and t.num_val_batches == 1
    assert len(t.test(LinearModule(), make_loader(n=32, batch_size=4))) == 1
    with pytest.raises(trainer.ConfigurationError, match="limit_train_batches=1.5"):
        quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1.5).fit(
            LinearModule(), make_loader()
        )


def test_fast_dev_run_runs_one_batch_of_each_and_no_logger(tmp_path):
    counter = _ValCounter()
    t = trainer.Trainer(
        fast_dev_run=True,
        default_root_dir=str(tmp_path),
        callbacks=[counter],
        enable_progress_bar=False,
    )
    t.fit(LinearModule(), make_loader(n=32), make_loader(n=32))
    assert t.global_step == 1 and counter.val_steps == [1]
    # Lightning's: a DummyLogger in place of the default CSVLogger, which writes nothing
    assert [type(logger).__name__ for logger in t.loggers] == ["DummyLogger"]
    assert not (tmp_path / "trainer_logs").exists()
    t = trainer.Trainer(fast_dev_run=3, default_root_dir=str(tmp_path), enable_progress_bar=False)
    t.fit(LinearModule(), make_loader(n=32))
    assert t.global_step == 3


def test_estimated_stepping_batches(tmp_path):
    seen = {}

    class Reader(LinearModule):
        def configure_optimizers(self):
            seen["total"] = self.trainer.estimated_stepping_batches
            return super().configure_optimizers()

    quiet_trainer(tmp_path, max_epochs=3, accumulate_grad_batches=3).fit(
        Reader(), make_loader(n=28, batch_size=4)
    )
    assert seen["total"] == 3 * math.ceil(7 / 3)
    quiet_trainer(tmp_path, max_epochs=3, max_steps=4).fit(
        Reader(), make_loader(n=28, batch_size=4)
    )
    assert seen["total"] == 4
    with pytest.raises(trainer.ConfigurationError, match="estimated_stepping_batches"):
        _ = quiet_trainer(tmp_path).estimated_stepping_batches


def test_seed_makes_shuffled_runs_identical(tmp_path):
    def run():
        module = LinearModule()
        t = quiet_trainer(tmp_path, max_epochs=2, seed=123)
        torch.manual_seed(999)  # re-initialise differently: the Trainer's seed must not matter here
        with torch.no_grad():
            for p in module.parameters():
                p.zero_()
        t.fit(module, make_loader(n=32, batch_size=4, shuffle=True))
        return [p.detach().clone() for p in module.parameters()]

    first, second = run(), run()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_deterministic_is_restored_after_fit(tmp_path):
    seen = {}

    class Probe(Callback):
        def on_train_start(self, trainer, module):
            seen["during"] = torch.are_deterministic_algorithms_enabled()

    quiet_trainer(tmp_path, max_steps=1, deterministic=True, callbacks=[Probe()]).fit(
        LinearModule(), make_loader()
    )
    assert seen["during"] is True
    assert torch.are_deterministic_algorithms_enabled() is False


def test_compile_with_aot_eager_trains_the_same(tmp_path):
    torch.manual_seed(0)
    eager = LinearModule()
    torch.manual_seed(0)
    compiled = LinearModule()
    quiet_trainer(tmp_path, max_steps=3).fit(eager, make_loader())
    quiet_trainer(tmp_path, max_steps=3, compile={"backend": "aot_eager"}).fit(
        compiled, make_loader()
    )
    assert compiled._compiled_call_impl is not None
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
def test_compile_true_uses_inductor(tmp_path):
    module = LinearModule()
    quiet_trainer(tmp_path, max_steps=2, compile=True).fit(module, make_loader())
    assert module._compiled_call_impl is not None


def test_predict_returns_one_output_per_batch(tmp_path):
    out = quiet_trainer(tmp_path).predict(LinearModule(), make_loader(n=10, batch_size=4))
    assert [o.shape[0] for o in out] == [4, 4, 2]


def test_validate_without_a_module_uses_the_fitted_modules_best_checkpoint(tmp_path):
    """Lightning's rule: no module and no ckpt_path after fit -> the best checkpoint, with a
    warning; without a ModelCheckpoint there is none to take, so it is refused."""
    t = quiet_trainer(tmp_path, max_epochs=2, enable_checkpointing=True)
    module = LinearModule()
    t.fit(module, make_loader())
    with pytest.warns(UserWarning, match="best checkpoint of the previous fit"):
        result = t.validate(dataloaders=make_loader())
    assert set(result[0]) == {"val/loss"}
    assert t.ckpt_path == t.checkpoint_callback.best_model_path
    unsaved = quiet_trainer(tmp_path / "unsaved", max_epochs=1)
    unsaved.fit(LinearModule(), make_loader())
    with pytest.raises(trainer.ConfigurationError, match="no ModelCheckpoint"):
        unsaved.validate(dataloaders=make_loader())
    assert unsaved.validate(unsaved.module, make_loader())[0].keys() == {"val/loss"}


def test_datamodule_provides_the_loaders_and_hparams(tmp_path):
    calls = []

    class Data(trainer.DataModule):
        def __init__(self, batch_size: int = 4):
            super().__init__()
            self.save_hyperparameters()

        def prepare_data(self):
            calls.append("prepare_data")

        def setup(self, stage):
            calls.append(f"setup:{stage}")

        def train_dataloader(self):
            return make_loader(batch_size=self.hparams.batch_size)

        def val_dataloader(self):
            return make_loader(batch_size=self.hparams.batch_size)

        def teardown(self, stage):
            calls.append(f"teardown:{stage}")

    t = trainer.Trainer(
        max_epochs=1,
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    t.fit(LinearModule(), datamodule=Data(batch_size=8))
    assert calls == ["prepare_data", "setup:fit", "teardown:fit"]
    assert t.global_step == 4
    hparams = (tmp_path / "trainer_logs" / "version_0" / "hparams.yaml").read_text()
    assert "batch_size: 8" in hparams and "lr: 0.05" in hparams


def test_module_dataloader_methods_are_used(tmp_path):
    class WithData(LinearModule):
        def train_dataloader(self):
            return make_loader(n=12)

    t = quiet_trainer(tmp_path, max_epochs=1)
    t.fit(WithData())
    assert t.global_step == 3


def test_manual_optimization_counts_steps_and_uses_hooks(tmp_path):
    class GAN(LinearModule):
        automatic_optimization = False

        def __init__(self):
            super().__init__()
            self.other = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            opt_a, opt_b = self.optimizers()
            x, y = batch
            for opt, net in ((opt_a, self.net), (opt_b, self.other)):
                loss = torch.nn.functional.mse_loss(net(x), y)
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            self.log("loss", loss)

        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.net.parameters(), lr=0.1),
                torch.optim.SGD(self.other.parameters(), lr=0.1),
            ]

    backward_calls = []

    class Probe(Callback):
        def on_after_backward(self, trainer, module):
            backward_calls.append(trainer.global_step)

    module = GAN()
    before = module.other.weight.detach().clone()
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[Probe()])
    t.fit(module, make_loader(n=16))
    assert t.global_step == 8  # two optimizer steps per batch, 4 batches
    assert len(backward_calls) == 8
    assert not torch.equal(before, module.other.weight)


def test_callback_logged_and_progress_bar_metrics(tmp_path):
    t = quiet_trainer(tmp_path, max_epochs=1, log_every_n_steps=2)
    t.fit(LinearModule(), make_loader(n=16), make_loader(n=8))
    assert set(t.callback_metrics) == {"train/loss", "val/loss"}
    assert all(isinstance(v, torch.Tensor) for v in t.callback_metrics.values())
    assert set(t.logged_metrics) == {"train/loss", "val/loss"}
    assert set(t.progress_bar_metrics) == {"train/loss"}  # only prog_bar=True
    assert isinstance(t.progress_bar_metrics["train/loss"], float)


def test_trainer_properties(tmp_path):
    t = quiet_trainer(tmp_path, precision="bf16")
    assert t.precision == "bf16-mixed"
    assert t.is_global_zero and t.world_size == 1 and t.global_rank == 0 and t.local_rank == 0
    assert isinstance(t.accelerator, trainer.Accelerator)
    assert t.strategy is t.accelerator.strategy
    assert t.logger is None and t.log_dir == str(tmp_path) and t.checkpoint_callback is None
    assert quiet_trainer(tmp_path, logger=True).logger.log_dir.startswith(str(tmp_path))


def test_default_callbacks_are_summary_progress_bar_and_checkpoint(tmp_path):
    t = trainer.Trainer(default_root_dir=str(tmp_path))
    names = [type(cb).__name__ for cb in t.callbacks]
    assert names == ["ModelSummary", "RichProgressBar", "ModelCheckpoint", "FitSummary"]
    off = trainer.Trainer(
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False
    )
    assert off.callbacks == []
    # A user's ModelCheckpoint replaces the default and moves last.
    from trainer.callbacks import ModelCheckpoint

    mine = ModelCheckpoint(monitor="val/loss")
    t = trainer.Trainer(
        callbacks=[mine, _ValCounter()], enable_progress_bar=False, enable_model_summary=False
    )
    assert t.callbacks[-1] is mine and len(t.callbacks) == 2
    with_summary = trainer.Trainer(callbacks=[mine], enable_progress_bar=False)
    assert [type(cb).__name__ for cb in with_summary.callbacks] == [
        "ModelSummary",
        "ModelCheckpoint",
        "FitSummary",
    ]


def test_accumulate_grad_batches_can_change_between_epochs(tmp_path):
    class Schedule(Callback):
        def on_train_epoch_start(self, trainer, module):
            trainer.accumulate_grad_batches = 1 if trainer.current_epoch == 0 else 4

    t = quiet_trainer(tmp_path, max_epochs=2, callbacks=[Schedule()])
    t.fit(LinearModule(), make_loader(n=32, batch_size=4))
    assert t.global_step == 8 + 2
    assert t.accelerator.gradient_accumulation_steps == 4
    with pytest.raises(trainer.ConfigurationError, match="accumulate_grad_batches=0"):
        t.accumulate_grad_batches = 0


def test_test_results_reach_the_csv_file_when_test_returns(tmp_path):
    t = trainer.Trainer(
        default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False
    )
    t.test(LinearModule(), make_loader())
    text = (tmp_path / "trainer_logs" / "version_0" / "metrics.csv").read_text()
    assert "test/loss" in text.splitlines()[0] and len(text.splitlines()) == 2


def test_public_train_dataloader_model_and_reset(tmp_path):
    seen = {}

    class Sized(LinearModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 4

        def train_dataloader(self):
            return make_loader(n=32, batch_size=self.batch_size)

        def training_step(self, batch, batch_idx):  # no self.log: on_fit_start refuses it
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

    class Resize(Callback):
        def on_fit_start(self, trainer, module):
            seen["before"] = trainer.train_dataloader.batch_size
            assert trainer.model(
                "training_step", next(iter(trainer.train_dataloader)), 0
            ).requires_grad
            module.batch_size = 8
            trainer.reset_train_dataloader()
            seen["after"] = trainer.train_dataloader.batch_size

    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[Resize()])
    t.fit(Sized())
    assert seen == {"before": 4, "after": 8} and t.global_step == 4
    with pytest.raises(trainer.ConfigurationError, match="cannot be rebuilt"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[Resize()]).fit(Sized(), make_loader())


def test_eval_only_module_validates_and_tests(tmp_path):
    class EvalOnly(trainer.TrainModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def validation_step(self, batch, batch_idx):
            self.log("val/out", self.net(batch[0]).mean())

    assert set(quiet_trainer(tmp_path).validate(EvalOnly(), make_loader())[0]) == {"val/out"}


def test_manual_optimization_refuses_trainer_accumulation_and_clipping(tmp_path):
    class Manual(LinearModule):
        automatic_optimization = False

        def training_step(self, batch, batch_idx):
            return None

    for kwargs in ({"accumulate_grad_batches": 2}, {"gradient_clip_val": 1.0}):
        with pytest.raises(trainer.ConfigurationError, match="manual optimization"):
            quiet_trainer(tmp_path, max_epochs=1, **kwargs).fit(Manual(), make_loader())


def test_manual_optimization_step_logs_reach_the_loggers(tmp_path):
    from tests.test_module import MemoryLogger

    class Manual(LinearModule):
        automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.log("manual/loss", loss)

    memory = MemoryLogger()
    quiet_trainer(tmp_path, max_epochs=1, logger=memory, log_every_n_steps=2).fit(
        Manual(), make_loader(n=32)
    )
    # after batches 2, 4, 6, 8, at Lightning's steps (optimizer steps before the batch's)
    assert [step for step, row in memory.rows if "manual/loss" in row] == [1, 3, 5, 7]


def test_log_errors_name_the_running_step(tmp_path):
    class BadVal(LinearModule):
        def validation_step(self, batch, batch_idx):
            self.log("x", "nope")

    with pytest.raises(trainer.ConfigurationError, match="in validation_step"):
        quiet_trainer(tmp_path).validate(BadVal(), make_loader())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"check_val_every_n_epoch": 0}, "check_val_every_n_epoch=0"),
        ({"logger": "csv"}, "logger='csv'"),
        ({"logger": print}, "logger=<built-in function print>"),
    ],
)
def test_more_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(trainer.ConfigurationError, match=match):
        trainer.Trainer(**kwargs)


def test_plateau_with_strict_false_skips_when_the_metric_is_missing(tmp_path):
    class Loose(LinearModule):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            return {
                "optimizer": opt,
                "lr_scheduler": {"scheduler": plateau, "monitor": "missing", "strict": False},
            }

    t = quiet_trainer(tmp_path, max_epochs=2)
    t.fit(Loose(), make_loader(n=8))
    assert t.optimizers[0].param_groups[0]["lr"] == 1.0


class _ValAt(Callback):
    """Where each validation of a fit starts: (epoch, global_step)."""

    def __init__(self) -> None:
        self.at: list[tuple[int, int]] = []

    def on_validation_start(self, trainer, module):
        if not trainer.sanity_checking:
            self.at.append((trainer.current_epoch, trainer.global_step))


def test_validation_counted_over_the_fit_continues_across_a_resume(tmp_path):
    """check_val_every_n_epoch=None counts val_check_interval's batches over the whole fit; the
    count is in the checkpoint, so a resumed run validates where the uninterrupted one does."""
    options = dict(
        max_epochs=3, val_check_interval=4, check_val_every_n_epoch=None, accumulate_grad_batches=2
    )
    full = _ValAt()
    quiet_trainer(tmp_path / "full", callbacks=[full], **options).fit(
        LinearModule(), make_loader(n=12), make_loader(n=8)
    )
    # 3 batches per epoch, 2 optimizer steps each: the fit's 4th and 8th batches validate.
    assert full.at == [(1, 2), (2, 5)]
    first = quiet_trainer(tmp_path / "a", max_steps=3, **options)
    first.fit(LinearModule(), make_loader(n=12), make_loader(n=8))
    assert (first.progress.total_batches, first.global_step) == (5, 3)
    first.save_checkpoint(tmp_path / "ck")
    resumed = _ValAt()
    second = quiet_trainer(tmp_path / "b", callbacks=[resumed], **options)
    second.fit(LinearModule(), make_loader(n=12), make_loader(n=8), ckpt_path=tmp_path / "ck")
    assert resumed.at == [(2, 5)]
    assert (second.progress.total_batches, second.global_step) == (9, 6)


def test_max_time_validates_after_the_batch_it_stops(tmp_path):
    """Lightning's Timer turns max_time into should_stop, after which the batch validates."""

    class Slow(LinearModule):
        def training_step(self, batch, batch_idx):
            time.sleep(0.1)
            return super().training_step(batch, batch_idx)

    at = _ValAt()
    fit = quiet_trainer(tmp_path, max_epochs=1, max_time={"seconds": 2}, callbacks=[at])
    fit.fit(Slow(), make_loader(n=400, batch_size=4), make_loader(n=8))  # 100 batches
    assert 0 < fit.global_step < 100
    assert at.at == [(0, fit.global_step)]


@pytest.mark.parametrize("stateful", [False, True])
def test_persistent_workers_end_with_the_stage(tmp_path, stateful):
    # As Lightning: a loader's persistent workers end when fit / validate returns. Left to the
    # collector, they were told to stop only after their queues were gone, so each waited out
    # its 5 s timeout before being killed, stalling the thread that collected them (a checkpoint
    # writer's, in the suite: 30-60 s per test).
    import multiprocessing

    if stateful:
        pytest.importorskip("torchdata")
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        from torch.utils.data import DataLoader as Loader
    dataset = make_loader(16).dataset
    train = Loader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    val = Loader(dataset, batch_size=4, num_workers=1, persistent_workers=True)
    before = set(multiprocessing.active_children())
    fit = quiet_trainer(tmp_path, max_epochs=2, seed=0)
    fit.fit(LinearModule(), train, val)
    assert set(multiprocessing.active_children()) == before  # every worker joined already
    assert train._iterator is None and val._iterator is None
    assert fit.validate(LinearModule(), val, verbose=False)  # the next stage starts new ones
    assert set(multiprocessing.active_children()) == before


def test_interrupted_and_print_as_in_lightning(tmp_path, capsys):
    class Interrupted(LinearModule):
        def training_step(self, batch, batch_idx):
            raise KeyboardInterrupt

    fit = quiet_trainer(tmp_path, max_steps=2)
    assert fit.interrupted is False
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        fit.fit(Interrupted(), make_loader())
    assert fit.interrupted is True
    fit.print("from rank zero")  # one process: rank zero prints
    assert "from rank zero" in capsys.readouterr().out


def test_received_sigterm_and_device_ids(tmp_path):
    import signal

    seen: list[bool] = []

    class Terminated(LinearModule):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's preemption notice
            return super().training_step(batch, batch_idx)

    watch = trainer.callbacks.LambdaCallback(
        on_train_batch_end=lambda t, m, *args: seen.append(t.received_sigterm)
    )
    fit = quiet_trainer(tmp_path, max_epochs=1, callbacks=[watch])
    assert fit.device_ids == [0] and not fit.received_sigterm
    with pytest.raises(SystemExit) as stopped:  # saved a checkpoint, then exits cleanly
        fit.fit(Terminated(), make_loader(n=64))
    assert stopped.value.code == 0
    assert seen == [False, False, True]
    assert fit.state.status == "interrupted" and fit.interrupted  # as Lightning's SIGTERM exit


def test_a_signal_after_the_last_step_still_saves_and_exits(tmp_path):
    """SIGTERM during the last epoch's end (after the last batch's check) was dropped: fit
    returned as if nothing had come, and the job ran on past its scheduler's notice."""
    import signal

    ended: list[str] = []

    class TerminatedAtTheEnd(LinearModule):
        def on_train_epoch_end(self):
            if self.current_epoch == 1:
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_end(self):
            ended.append("on_train_end")

    fit = quiet_trainer(tmp_path, max_epochs=2)
    with pytest.raises(SystemExit) as stopped:
        fit.fit(TerminatedAtTheEnd(), make_loader())
    assert stopped.value.code == 0
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "preempted-epoch=2-step=16" in saved, saved  # the 2 epochs are complete
    assert ended == [] and fit.state.status == "interrupted"


@pytest.mark.parametrize("hook", ["on_train_end", "on_fit_end"])
def test_a_signal_in_the_fits_end_hooks_saves_and_exits(tmp_path, hook):
    """SIGTERM in on_train_end / on_fit_end (after the fit loop's last check) killed the process
    with status 143 (the handlers were gone) and nothing of the finished fit was saved."""
    import signal

    class TerminatedInTheEnd(LinearModule):
        pass

    setattr(TerminatedInTheEnd, hook, lambda self: os.kill(os.getpid(), signal.SIGTERM))
    fit = quiet_trainer(tmp_path, max_epochs=2)
    with pytest.raises(SystemExit) as stopped:
        fit.fit(TerminatedInTheEnd(), make_loader())
    assert stopped.value.code == 0
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["preempted-epoch=2-step=16"], saved
    assert fit.state.status == "interrupted"


def test_a_preemption_checkpoint_replaces_the_earlier_ones(tmp_path):
    """Each preemption of a long job left a full `preempted-…` checkpoint behind, for ever."""
    import signal

    class TerminatedAt(LinearModule):
        def __init__(self, step):
            super().__init__()
            self.signal_step = step

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.trainer.global_step == self.signal_step:
                os.kill(os.getpid(), signal.SIGTERM)

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "preempted-notes").mkdir()  # not a preemption checkpoint's name: kept
    for step in (3, 10, 13):
        fit = quiet_trainer(tmp_path, max_epochs=3)
        with pytest.raises(SystemExit):
            fit.fit(TerminatedAt(step), make_loader(), ckpt_path="last" if step > 3 else None)
    assert sorted(p.name for p in folder.iterdir()) == [
        "preempted-epoch=1-step=13",
        "preempted-notes",
    ]


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_signal_during_an_evaluation_finishes_it_then_exits(tmp_path, stage, capsys):
    """SIGTERM during test() (e.g. right after fit) killed the process with status 143 before
    the epoch's results were printed or logged; now the call finishes, then exits 0."""
    import signal

    batches: list[int] = []

    def signal_at_the_first_batch(outputs, batch, batch_idx, dataloader_idx=0):
        batches.append(batch_idx)
        if batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    name = {"validate": "validation", "test": "test", "predict": "predict"}[stage]
    module = LinearModule()
    setattr(module, f"on_{name}_batch_end", signal_at_the_first_batch)
    csv = trainer.loggers.CSVLogger(tmp_path)
    evaluate = quiet_trainer(tmp_path, logger=csv, enable_progress_bar=False)
    with pytest.raises(SystemExit) as stopped:
        getattr(evaluate, stage)(module, make_loader(n=12))
    assert stopped.value.code == 0
    assert evaluate.state.status == "interrupted"
    err = capsys.readouterr().err
    assert f"received SIGTERM during {stage}; the {stage} epoch is complete" in err, err
    assert batches == [0, 1, 2]  # the epoch went on to its end
    if stage != "predict":  # and its value reached the logger
        logged = (Path(csv.log_dir) / "metrics.csv").read_text()
        assert f"{name if name == 'test' else 'val'}/loss" in logged, logged


def test_logged_hparams_are_the_initial_ones_and_a_clash_with_the_datamodule_is_refused(tmp_path):
    class Data(trainer.DataModule):
        def __init__(self, lr: float = 0.5):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return make_loader()

    module = LinearModule(lr=0.05)  # records lr with save_hyperparameters
    module.hparams.lr = 0.01  # changed after recording: Lightning logs the recorded 0.05
    fit = quiet_trainer(tmp_path, max_epochs=1, logger=trainer.loggers.CSVLogger(tmp_path))
    with pytest.raises(trainer.ConfigurationError, match=r"\['lr'\] are saved by both"):
        fit.fit(module, datamodule=Data())
    fit = quiet_trainer(tmp_path, max_epochs=1, logger=trainer.loggers.CSVLogger(tmp_path))
    fit.fit(module, make_loader())
    assert "lr: 0.05" in (Path(fit.logger.log_dir) / "hparams.yaml").read_text()


def test_a_run_does_not_collect_garbage(tmp_path):
    """A full gc.collect() costs ~0.1 s in a process with torch loaded: once per fit it made
    fit's set-up and teardown 100x slower (bench_overhead's setup ms: 1.5 -> 145)."""
    import gc

    collections: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    run = quiet_trainer(tmp_path, max_steps=2)
    gc.disable()  # no automatic collection: only explicit gc.collect() calls are recorded
    gc.callbacks.append(record)
    try:
        run.fit(LinearModule(), make_loader())
        run.validate(run.module, verbose=False)
    finally:
        gc.callbacks.remove(record)
        gc.enable()
    assert collections == []
    # Accelerate's free_memory does collect, and so does the Accelerator's when asked directly
    gc.callbacks.append(record)
    try:
        assert run.accelerator.free_memory(1, 2) == [None, None]
    finally:
        gc.callbacks.remove(record)
    assert 2 in collections
