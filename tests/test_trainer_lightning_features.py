"""Trainer features ported from Lightning 2.6, tested without Lightning installed.

tests/parity/test_loop_features.py and test_eval_features.py compare each of them with Lightning
itself; these pin the behaviour and the error messages on their own: ``min_epochs`` /
``min_steps``, ``overfit_batches``, ``reload_dataloaders_every_n_epochs``, ``inference_mode``,
the default ``predict_step``, several evaluation dataloaders, ``checkpoint_callbacks`` /
``progress_bar_callback``, the ``lr_scheduler_step`` hook, LBFGS, a skipped epoch and where a
resumed run starts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer import Trainer
from trainer.callbacks import Callback, ModelCheckpoint, RichProgressBar
from trainer.errors import ConfigurationError
from trainer.trainer.closure import check_closure_precision, needs_closure


# ---- arguments -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"min_epochs": 1.5}, "min_epochs"),
        ({"min_steps": 2.5}, "min_steps"),
        ({"overfit_batches": 1.5}, "overfit_batches"),
        ({"overfit_batches": -1}, "overfit_batches"),
        ({"overfit_batches": True}, "overfit_batches"),
        ({"reload_dataloaders_every_n_epochs": -1}, "reload_dataloaders_every_n_epochs"),
        ({"inference_mode": "yes"}, "inference_mode"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"Trainer\({argument}="):
        Trainer(logger=False, **kwargs)


def test_min_limits_resolve_as_in_lightning() -> None:
    assert (Trainer(logger=False).min_epochs, Trainer(logger=False).min_steps) == (0, None)
    assert Trainer(logger=False, min_steps=5).min_epochs == 1  # re-checked after epoch 0
    assert Trainer(logger=False, min_epochs=3, min_steps=5).min_epochs == 3


def test_overfit_batches_replaces_both_limits() -> None:
    t = Trainer(logger=False, overfit_batches=3, limit_train_batches=10, limit_val_batches=0.5)
    assert (t.limit_batches["train"], t.limit_batches["validation"]) == (3, 3)
    assert t.limit_batches["test"] is None


# ---- min_epochs / min_steps --------------------------------------------------------------------
class StopEveryBatch(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        trainer.should_stop = True


@pytest.mark.parametrize(
    ("options", "steps", "epoch"),
    [({}, 1, 0), ({"min_epochs": 2}, 16, 2), ({"min_steps": 11}, 11, 1)],
)
def test_should_stop_waits_for_the_minimum(tmp_path, options, steps, epoch) -> None:
    t = quiet_trainer(tmp_path, max_epochs=5, callbacks=[StopEveryBatch()], **options)
    t.fit(LinearModule(), make_loader(n=32, batch_size=4))  # 8 batches per epoch
    assert (t.global_step, t.current_epoch) == (steps, epoch)


class _Empty(IterableDataset):
    def __iter__(self):
        return iter(())


def test_an_empty_epoch_ends_the_fit_whatever_min_epochs_says(tmp_path) -> None:
    t = quiet_trainer(tmp_path, max_epochs=-1, min_epochs=3)
    with pytest.warns(UserWarning, match="yielded no batches"):
        t.fit(LinearModule(), DataLoader(_Empty(), batch_size=4))
    assert t.global_step == 0


# ---- overfit_batches and reloading -----------------------------------------------------------
class BatchRecorder(LinearModule):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, float]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(("train", self.current_epoch, round(float(batch[0].sum()), 4)))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.seen.append(("val", self.current_epoch, round(float(batch[0].sum()), 4)))
        return super().validation_step(batch, batch_idx)


def test_overfit_batches_reads_the_first_batches_in_order_every_epoch(tmp_path) -> None:
    module = BatchRecorder()
    shuffled = make_loader(n=32, batch_size=4, shuffle=True)
    in_order = [round(float(x.sum()), 4) for x, _ in make_loader(n=32, batch_size=4)][:2]
    t = quiet_trainer(tmp_path, max_epochs=2, overfit_batches=2)
    with pytest.warns(UserWarning, match="reads in order"):
        t.fit(module, shuffled, make_loader(n=16, batch_size=4, seed=1))
    train = [(epoch, value) for kind, epoch, value in module.seen if kind == "train"]
    assert train == [(0, in_order[0]), (0, in_order[1]), (1, in_order[0]), (1, in_order[1])]
    assert t.num_training_batches == 2 and t.num_val_batches == 2


class Reloading(LinearModule):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, int]] = []

    def train_dataloader(self):
        self.requests.append(("train", self.current_epoch))
        return make_loader(n=8 * len(self.requests), batch_size=4)  # grows with each request

    def val_dataloader(self):
        self.requests.append(("val", self.current_epoch))
        return make_loader(n=8, batch_size=4, seed=1)


def test_reload_dataloaders_every_n_epochs_asks_again(tmp_path) -> None:
    module = Reloading()
    t = quiet_trainer(tmp_path, max_epochs=5, reload_dataloaders_every_n_epochs=2)
    t.fit(module)
    assert [e for kind, e in module.requests if kind == "train"] == [0, 2, 4]
    assert [e for kind, e in module.requests if kind == "val"] == [0, 2, 4]
    assert t.num_training_batches > 2  # the reloaded loader is the one trained on


def test_loaders_given_to_fit_are_kept_when_reloading(tmp_path) -> None:
    given = make_loader(n=16, batch_size=4)
    t = quiet_trainer(tmp_path, max_epochs=3, reload_dataloaders_every_n_epochs=1)
    t.fit(LinearModule(), given)
    assert t.train_dataloader.base_dataloader is given and t.global_step == 12


# ---- several evaluation dataloaders ---------------------------------------------------------
class TwoLoaders(LinearModule):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test/index", float(dataloader_idx))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return dataloader_idx


class IndexRecorder(Callback):
    """One callback that takes dataloader_idx, checked beside Callback's own signature."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen.append((batch_idx, dataloader_idx))


def test_several_dataloaders_give_one_result_each(tmp_path) -> None:
    recorder = IndexRecorder()
    t = quiet_trainer(tmp_path, callbacks=[recorder, RichProgressBar()])
    loaders = [make_loader(n=8, batch_size=4), make_loader(n=4, batch_size=4, seed=1)]
    results = t.validate(TwoLoaders(), loaders)
    assert [list(r) for r in results] == [
        ["val/loss/dataloader_idx_0"],
        ["val/loss/dataloader_idx_1"],
    ]
    assert recorder.seen == [(0, 0), (1, 0), (0, 1)]
    assert t.num_val_batches == 3
    tested = t.test(TwoLoaders(), {"a": loaders[0], "b": loaders[1]})
    assert tested == [{"test/index/dataloader_idx_0": 0.0}, {"test/index/dataloader_idx_1": 1.0}]
    assert t.predict(TwoLoaders(), loaders) == [[0, 0], [1]]


class NoIndex(LinearModule):
    def validation_step(self, batch, batch_idx):
        return None


class RequiresIndex(LinearModule):
    def validation_step(self, batch, batch_idx, dataloader_idx):
        return None


@pytest.mark.parametrize(
    ("module", "count", "fix"),
    [(NoIndex(), 2, "Add `dataloader_idx=0`"), (RequiresIndex(), 1, "Give it a default")],
)
def test_dataloader_idx_in_the_step_is_checked(tmp_path, module, count, fix) -> None:
    loaders = [make_loader(n=4)] * count
    with pytest.raises(ConfigurationError, match=fix):
        quiet_trainer(tmp_path).validate(module, loaders)


def test_add_dataloader_idx_false_from_two_loaders_is_refused(tmp_path) -> None:
    class Mixed(LinearModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("loss", 1.0, add_dataloader_idx=False)

    with pytest.raises(ConfigurationError, match="add_dataloader_idx=False"):
        quiet_trainer(tmp_path).validate(Mixed(), [make_loader(n=4), make_loader(n=4)])


# ---- inference_mode and the default predict_step ----------------------------------------------
class GradProbe(LinearModule):
    def __init__(self) -> None:
        super().__init__()
        self.modes: list[tuple[bool, bool]] = []

    def validation_step(self, batch, batch_idx):
        self.modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))


@pytest.mark.parametrize("inference_mode", [True, False])
def test_inference_mode_in_validate_no_grad_inside_fit(tmp_path, inference_mode) -> None:
    module = GradProbe()
    t = quiet_trainer(tmp_path, max_epochs=1, inference_mode=inference_mode)
    t.fit(module, make_loader(n=4), make_loader(n=4))
    t.validate(module, make_loader(n=4))
    assert module.modes == [(False, False), (inference_mode, False)]


def test_default_predict_step_is_forward_on_the_batch(tmp_path) -> None:
    class Doubler(LinearModule):
        predict_step = trainer.TrainModule.predict_step  # the default, not LinearModule's

        def forward(self, batch):
            return batch[0] * 2

    outputs = quiet_trainer(tmp_path).predict(Doubler(), make_loader(n=8))
    expected = [x * 2 for x, _ in make_loader(n=8)]
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))


# ---- checkpoint_callbacks / progress_bar_callback ----------------------------------------------
def test_checkpoint_callbacks_and_progress_bar_callback(tmp_path) -> None:
    t = Trainer(default_root_dir=tmp_path, logger=False)
    assert [type(cb) for cb in t.checkpoint_callbacks] == [ModelCheckpoint]
    assert isinstance(t.progress_bar_callback, RichProgressBar)
    bare = Trainer(default_root_dir=tmp_path, barebones=True)
    assert (bare.checkpoint_callbacks, bare.progress_bar_callback) == ([], None)


# ---- lr_scheduler_step, LBFGS ----------------------------------------------------------------
class Scheduled(LinearModule):
    def __init__(self, *, overrides_step: bool) -> None:
        super().__init__(lr=0.1)
        self.overrides_step = overrides_step
        self.stepped: list[tuple[str, int]] = []

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def lr_scheduler_step(self, scheduler, metric):
        self.stepped.append((type(scheduler).__name__, self.current_epoch))
        if not self.overrides_step:
            super().lr_scheduler_step(scheduler, metric)


@pytest.mark.parametrize("overrides_step", [False, True])
def test_lr_scheduler_step_hook_steps_or_replaces(tmp_path, overrides_step) -> None:
    module = Scheduled(overrides_step=overrides_step)
    t = quiet_trainer(tmp_path, max_epochs=3)
    t.fit(module, make_loader(n=8))
    assert module.stepped == [("StepLR", 0), ("StepLR", 1), ("StepLR", 2)]
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 if overrides_step else 0.0125)


class WithLBFGS(LinearModule):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        optimizer = torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1),
        }


def test_lbfgs_steps_with_a_closure_that_reevaluates_the_batch(tmp_path) -> None:
    torch.manual_seed(0)  # not the RNG state earlier tests leave: LBFGS(lr=0.5) can diverge
    module = WithLBFGS()
    t = quiet_trainer(tmp_path, max_epochs=2)
    t.fit(module, make_loader(n=16, batch_size=8))
    assert t.global_step == 4 and module.steps > 4  # LBFGS evaluated each batch several times
    raw = t.optimizers[0].optimizer
    assert vars(raw)["step"]._wrapped_by_lr_sched  # the scheduler's step counter is back
    x, y = next(iter(make_loader(n=16, batch_size=16)))
    before = torch.nn.functional.mse_loss(LinearModule()(x), y)  # same seed-free init scale
    assert float(torch.nn.functional.mse_loss(module(x), y)) < float(before)


def test_closure_optimizers_are_recognised_and_refused_under_a_scaler() -> None:
    params = [torch.nn.Parameter(torch.zeros(1))]
    assert needs_closure(torch.optim.LBFGS(params)) and not needs_closure(torch.optim.SGD(params))

    class Scaled:
        name = "16-mixed"
        scaler = object()

    with pytest.raises(ConfigurationError, match="precision='32-true'"):
        check_closure_precision(torch.optim.LBFGS(params), Scaled())


# ---- a skipped epoch; where a resumed run starts -------------------------------------------------
class SkipSecondEpoch(LinearModule):
    def __init__(self) -> None:
        super().__init__()
        self.validated_in: list[int] = []

    def on_train_batch_start(self, batch, batch_idx):
        return -1 if self.current_epoch == 1 and batch_idx == 1 else None

    def on_validation_epoch_end(self):
        self.validated_in.append(self.current_epoch)


def test_a_skipped_epoch_does_not_validate_and_counts_as_done(tmp_path) -> None:
    module = SkipSecondEpoch()
    t = quiet_trainer(tmp_path, max_epochs=3)
    t.fit(module, make_loader(n=16), make_loader(n=8))
    assert module.validated_in == [0, 2]
    assert (t.current_epoch, t.global_step) == (3, 9)


class EpochEnds(Callback):
    def __init__(self) -> None:
        self.ends: list[int] = []

    def on_train_epoch_end(self, trainer, module):
        self.ends.append(trainer.current_epoch)


def test_resuming_from_a_validation_end_checkpoint_starts_the_next_epoch(tmp_path) -> None:
    saver = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1, monitor=None)
    first = quiet_trainer(tmp_path, max_epochs=1, callbacks=[saver], enable_checkpointing=True)
    first.fit(LinearModule(), make_loader(n=16), make_loader(n=8))
    ends = EpochEnds()
    resumed = quiet_trainer(tmp_path, max_epochs=2, callbacks=[ends])
    path = saver.best_model_path  # saved at the end of epoch 0's validation
    resumed.fit(LinearModule(), make_loader(n=16), make_loader(n=8), ckpt_path=path)
    assert ends.ends == [1] and resumed.global_step == 8
