"""The Lightning Trainer arguments of DESIGN §9: profiler, sync_batchnorm, benchmark, barebones,
plugins — each with Lightning's meaning, and a clear error where it cannot apply."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback
from trainer.profilers import PassThroughProfiler, SimpleProfiler


class _Hooked(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        pass


def test_simple_profiler_times_steps_hooks_and_fetching_and_writes_its_report(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path / "profile", filename="perf")
    fit = quiet_trainer(tmp_path, max_epochs=1, profiler=profiler, callbacks=[_Hooked()])
    assert fit.profiler is profiler
    fit.fit(LinearModule(), make_loader(n=16, batch_size=4), make_loader(n=8, batch_size=4))
    summary = profiler.summary()
    for action in (
        "run_training_epoch",
        "run_training_batch",
        "get_train_batch",
        "training_step",
        "backward",
        "optimizer_step",
        "zero_grad",
        "run_validation",
        "validation_step",
        "[Callback]_Hooked.on_train_batch_end",
    ):
        assert action in summary, action
    report = tmp_path / "profile" / "fit-perf.txt"
    assert report.is_file() and "training_step" in report.read_text()
    assert "_train_batch" not in vars(fit)  # the timed wrappers are gone after the run


def test_profiler_names_and_the_default(tmp_path):
    assert isinstance(quiet_trainer(tmp_path).profiler, PassThroughProfiler)
    assert isinstance(quiet_trainer(tmp_path, profiler="simple").profiler, SimpleProfiler)
    with pytest.raises(trainer.ConfigurationError, match="profiler"):
        quiet_trainer(tmp_path, profiler="fastest")


def test_no_profiler_leaves_the_step_path_unwrapped(tmp_path):
    seen: list[bool] = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append("_train_batch" in vars(trainer) or "_backward" in vars(trainer))

    quiet_trainer(tmp_path, max_epochs=1, callbacks=[Probe()]).fit(LinearModule(), make_loader())
    assert seen and not any(seen)


def test_barebones_turns_off_logging_checkpointing_bar_and_summary(tmp_path):
    fit = trainer.Trainer(barebones=True, default_root_dir=tmp_path, max_epochs=1)
    assert fit.loggers == [] and fit.callbacks == [] and fit.checkpoint_callback is None
    assert isinstance(fit.profiler, PassThroughProfiler)
    fit.fit(LinearModule(), make_loader())
    assert fit.global_step == len(make_loader())
    assert list(tmp_path.iterdir()) == []  # nothing written
    with pytest.raises(trainer.ConfigurationError, match="barebones"):
        trainer.Trainer(barebones=True, profiler="simple")


def test_sync_batchnorm_on_cpu_with_several_processes_is_refused_before_anything_starts():
    with pytest.raises(trainer.ConfigurationError, match="sync_batchnorm.*CPU"):
        trainer.Trainer(strategy="ddp", accelerator="cpu", devices=2, sync_batchnorm=True)
    with pytest.raises(trainer.ConfigurationError, match="sync_batchnorm"):
        trainer.Trainer(sync_batchnorm="yes")


def test_sync_batchnorm_on_one_process_changes_nothing(tmp_path):
    class WithNorm(LinearModule):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(4)

        def forward(self, x):
            return self.net(self.norm(x))

    module = WithNorm()
    quiet_trainer(tmp_path, max_epochs=1, sync_batchnorm=True).fit(module, make_loader())
    assert type(module.norm) is torch.nn.BatchNorm1d


def test_benchmark_sets_cudnn_benchmark_as_lightning_does():
    before = torch.backends.cudnn.benchmark
    try:
        trainer.Trainer(benchmark=True, logger=False)
        assert torch.backends.cudnn.benchmark is True
        trainer.Trainer(deterministic=True, logger=False)  # None + deterministic -> False
        assert torch.backends.cudnn.benchmark is False
        torch.backends.cudnn.benchmark = True
        trainer.Trainer(logger=False)  # None: left as set
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before


def test_plugins_take_a_precision_instance_and_refuse_other_objects(tmp_path):
    plugin = trainer.precision.resolve_precision("bf16-mixed")
    fit = quiet_trainer(tmp_path, plugins=[plugin])
    assert fit.precision_plugin is plugin and fit.precision == "bf16-mixed"
    with pytest.raises(trainer.ConfigurationError, match="plugins"):
        quiet_trainer(tmp_path, plugins=[object()])


class _SlowDataset(torch.utils.data.Dataset):
    """A dataset whose items cost ``delay`` seconds each (a decoding step, say)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.x = torch.randn(48, 4)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        return self.x[index], self.x[index].sum(dim=0, keepdim=True)


class _ComputeBound(LinearModule):
    """A step that takes ``step_seconds`` (the forward and backward of a real model, say)."""

    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.step_seconds = step_seconds

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_seconds)
        return super().training_step(batch, batch_idx)


def _loading_warnings(tmp_path, *, item_seconds: float, step_seconds: float) -> list[str]:
    loader = torch.utils.data.DataLoader(_SlowDataset(item_seconds), batch_size=4)
    module = _ComputeBound(step_seconds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(tmp_path, max_epochs=2, profiler="simple").fit(module, loader)
    return [str(w.message) for w in caught if "bottleneck" in str(w.message)]


def test_a_slow_dataset_is_named_as_the_bottleneck_once(tmp_path):
    # 4 items x 5 ms = 20 ms to fetch a batch, against a 2 ms step: about 90 % fetching.
    messages = _loading_warnings(tmp_path, item_seconds=0.005, step_seconds=0.002)
    assert len(messages) == 1  # once, though both epochs measured it
    assert "_SlowDataset" in messages[0] and "num_workers=0" in messages[0]


def test_a_fast_dataset_gets_no_bottleneck_warning(tmp_path):
    # Fetching a batch costs well under 1 ms, against a 20 ms step: a few percent at most.
    assert _loading_warnings(tmp_path, item_seconds=0.0, step_seconds=0.02) == []
