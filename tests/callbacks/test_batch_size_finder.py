"""Tests of trainer/callbacks/batch_size_finder.py: power and binsearch under a memory limit."""

from __future__ import annotations

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import BatchSizeFinder, Callback
from trainer.errors import ConfigurationError


class MemoryLimited(LinearModule):
    """Runs out of memory (a real torch.OutOfMemoryError) on batches larger than ``limit``."""

    def __init__(self, limit: int, batch_size: int = 2, samples: int = 96) -> None:
        super().__init__()
        self.limit = limit
        self.batch_size = batch_size
        self.samples = samples
        self.tried: list[int] = []

    def train_dataloader(self):
        return make_loader(n=self.samples, batch_size=self.batch_size)

    def training_step(self, batch, batch_idx):
        size = batch[0].shape[0]
        self.tried.append(size)
        if size > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size} MiB (limit {self.limit})."
            )
        return super().training_step(batch, batch_idx)


class BatchSizes(Callback):
    """The sizes of the batches the fit itself trains on (the finder calls no hooks)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.sizes.append(batch[0].shape[0])


@pytest.mark.parametrize(
    ("mode", "limit", "expected"),
    [("power", 12, 8), ("binsearch", 12, 12), ("power", 32, 32), ("binsearch", 23, 23)],
)
def test_finds_the_largest_size_under_the_limit_and_fits_with_it(tmp_path, mode, limit, expected):
    module, seen = MemoryLimited(limit=limit), BatchSizes()
    finder = BatchSizeFinder(mode=mode, steps_per_trial=2, margin=0.0)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[finder, seen])
    t.fit(module, val_dataloaders=None)
    assert finder.optimal_batch_size == expected and module.batch_size == expected
    full, rest = divmod(96, expected)
    assert seen.sizes == [expected] * full + ([rest] if rest else [])
    assert t.num_training_batches == len(seen.sizes)


def test_binsearch_trial_sequence(tmp_path):
    module = MemoryLimited(limit=12)
    finder = BatchSizeFinder(mode="binsearch", steps_per_trial=1)
    quiet_trainer(tmp_path, max_epochs=1, max_steps=1, callbacks=[finder]).fit(module)
    trials = module.tried[:-1]  # the last batch is the fit's own
    assert trials == [2, 4, 8, 16, 12, 14, 13]


def test_a_failing_first_size_is_halved_until_it_fits(tmp_path):
    module = MemoryLimited(limit=12, batch_size=100)
    finder = BatchSizeFinder(mode="power", init_val=32, steps_per_trial=1)
    quiet_trainer(tmp_path, max_epochs=1, max_steps=1, callbacks=[finder]).fit(module)
    assert module.tried[:-1] == [32, 16, 8, 16]
    assert finder.optimal_batch_size == 8


def test_trials_run_the_modules_hooks_and_no_callbacks(tmp_path):
    class Stepped(MemoryLimited):
        def __init__(self) -> None:
            super().__init__(limit=12)
            self.stepped: list[int] = []

        def on_before_optimizer_step(self, optimizer):
            self.stepped.append(self.tried[-1])

    module, seen = Stepped(), BatchSizes()
    finder = BatchSizeFinder(mode="power", steps_per_trial=1)
    quiet_trainer(tmp_path, max_epochs=1, max_steps=2, callbacks=[finder, seen]).fit(module)
    assert module.stepped == [2, 4, 8, 8, 8]  # the trials' steps (16 ran out), then the fit's
    assert seen.sizes == [8, 8]


def test_doubling_stops_once_the_size_covers_the_dataset(tmp_path):
    # Lightning 2.6's rule: 32 < 40 samples doubles to 64 (one batch of 40), which covers the
    # dataset, so the search stops there; the size is not cut to the dataset's length.
    module, seen = MemoryLimited(limit=1000, samples=40), BatchSizes()
    finder = BatchSizeFinder(mode="power", steps_per_trial=1)
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[finder, seen]).fit(module)
    assert finder.optimal_batch_size == 64 and module.tried[:-1] == [2, 4, 8, 16, 32, 40]
    assert seen.sizes == [40]


@pytest.mark.parametrize(("margin", "expected"), [(0.05, 21), (0.0, 23), (0.5, 11)])
def test_binsearch_takes_the_margin_off_the_size_found(tmp_path, margin, expected):
    module = MemoryLimited(limit=23)
    finder = BatchSizeFinder(mode="binsearch", steps_per_trial=1, margin=margin)
    quiet_trainer(tmp_path, max_epochs=1, max_steps=1, callbacks=[finder]).fit(module)
    assert finder.optimal_batch_size == expected == module.batch_size
    # power mode ignores it
    module = MemoryLimited(limit=23)
    finder = BatchSizeFinder(mode="power", steps_per_trial=1, margin=margin)
    quiet_trainer(tmp_path, max_epochs=1, max_steps=1, callbacks=[finder]).fit(module)
    assert finder.optimal_batch_size == 16


@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_max_val_caps_the_search_and_is_returned_untried(tmp_path, mode):
    module = MemoryLimited(limit=1000)
    finder = BatchSizeFinder(mode=mode, steps_per_trial=1, max_val=24, margin=0.0)
    quiet_trainer(tmp_path, max_epochs=1, max_steps=1, callbacks=[finder]).fit(module)
    assert finder.optimal_batch_size == 24 and module.tried[:-1] == [2, 4, 8, 16]


def test_trials_leave_the_weights_and_rng_as_they_were(tmp_path):
    class Record(Callback):
        def on_fit_start(self, trainer, module):
            self.weights = [p.detach().clone() for p in module.parameters()]
            self.rng = torch.get_rng_state()

    torch.manual_seed(0)
    before, after = Record(), Record()
    module = MemoryLimited(limit=12)
    t = quiet_trainer(
        tmp_path, max_epochs=1, max_steps=1, callbacks=[before, BatchSizeFinder(), after]
    )
    t.fit(module)
    assert all(torch.equal(a, b) for a, b in zip(before.weights, after.weights, strict=True))
    assert torch.equal(before.rng, after.rng)


def test_batch_size_in_hparams_and_checkpoint_resume_reuses_it(tmp_path):
    class HparamsModule(MemoryLimited):
        def __init__(self, batch_size: int = 2) -> None:
            super().__init__(limit=12)
            del self.batch_size
            self.hparams["batch_size"] = batch_size

        def train_dataloader(self):
            return make_loader(n=96, batch_size=self.hparams.batch_size)

    module = HparamsModule()
    t = quiet_trainer(
        tmp_path,
        max_epochs=2,
        max_steps=3,
        callbacks=[BatchSizeFinder(mode="binsearch", margin=0.0)],
    )
    t.fit(module)
    assert module.hparams.batch_size == 12
    t.save_checkpoint(tmp_path / "ck")
    resumed, seen = HparamsModule(), BatchSizes()
    finder = BatchSizeFinder(mode="binsearch", margin=0.0)
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[finder, seen]).fit(
        resumed, ckpt_path=tmp_path / "ck"
    )
    assert finder.optimal_batch_size == 12 and resumed.hparams.batch_size == 12
    assert resumed.tried == [12] * 5  # no search: the rest of epoch 0 (batches 3..7)


def test_other_errors_propagate(tmp_path):
    class Broken(MemoryLimited):
        def training_step(self, batch, batch_idx):
            raise ValueError("a bug, not memory")

    module = Broken(limit=12, batch_size=5)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[BatchSizeFinder()])
    with pytest.raises(ValueError, match="a bug, not memory"):
        t.fit(module)
    assert module.batch_size == 5  # the search's sizes are not left behind


def test_out_of_memory_at_every_size_is_a_configuration_error(tmp_path):
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[BatchSizeFinder(steps_per_trial=1)])
    with pytest.raises(ConfigurationError, match="every batch size tried ran out of memory"):
        t.fit(MemoryLimited(limit=0))


def test_missing_batch_size_or_loader_method_is_explained(tmp_path):
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[BatchSizeFinder(batch_arg_name="bs")])
    with pytest.raises(ConfigurationError, match=r"batch_arg_name='bs'.*no attribute"):
        t.fit(MemoryLimited(limit=12))

    class NoLoaderMethod(LinearModule):
        batch_size = 4

    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[BatchSizeFinder()])
    with pytest.raises(ConfigurationError, match=r"needs\s+train_dataloader\(\)"):
        t.fit(NoLoaderMethod(), make_loader())


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"mode": "linear"}, "mode"),
        ({"steps_per_trial": 0}, "steps_per_trial"),
        ({"init_val": 0}, "init_val"),
        ({"max_trials": 1.5}, "max_trials"),
        ({"batch_arg_name": ""}, "batch_arg_name"),
        ({"margin": 1.0}, "margin"),
        ({"max_val": 0}, "max_val"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(trainer.ConfigurationError, match=f"BatchSizeFinder\\({argument}="):
        BatchSizeFinder(**kwargs)
