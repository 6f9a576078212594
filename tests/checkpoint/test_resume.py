"""Exact resume: an interrupted-and-resumed fit ends with parameters equal to an uninterrupted one."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
from tests.checkpoint.resume_job import Net, SelfSignal, data
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import Callback, ModelCheckpoint

JOB = Path(__file__).with_name("resume_job.py")


def _fit(tmp_path, module, *, loader_workers=0, ckpt_path=None, **kwargs):
    t = quiet_trainer(tmp_path, **kwargs)
    t.fit(module, data(loader_workers), ckpt_path=ckpt_path)
    return t


def _uninterrupted(tmp_path, **kwargs) -> Net:
    torch.manual_seed(1)
    module = Net()
    _fit(tmp_path / "full", module, max_epochs=3, **kwargs)
    return module


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.isfinite(p).all(), f"{name}: the uninterrupted run diverged (lower the lr)"
        assert torch.equal(p, q), name


@pytest.mark.parametrize("stop_at", [3, 10, 13, 20])  # mid-epoch, epoch end, mid-epoch, epoch end
def test_resume_mid_epoch_and_at_epoch_end_is_exact(tmp_path, stop_at):
    full = _uninterrupted(tmp_path)
    torch.manual_seed(1)
    first = Net()
    t = _fit(tmp_path / "a", first, max_epochs=3, max_steps=stop_at)
    t.save_checkpoint(tmp_path / "ck")
    torch.manual_seed(
        99
    )  # a different init and RNG state: everything must come from the checkpoint
    resumed = Net()
    t2 = _fit(tmp_path / "b", resumed, max_epochs=3, ckpt_path=tmp_path / "ck")
    assert t2.global_step == 30 and t2.current_epoch == 3
    _assert_same(full, resumed)


@pytest.mark.parametrize(
    "stop_at", [2, 5]
)  # with accumulation 3 over 10 batches: windows end at 3, 6, 9, 10
def test_resume_with_accumulation_on_a_window_boundary(tmp_path, stop_at):
    full = _uninterrupted(tmp_path, accumulate_grad_batches=3)
    torch.manual_seed(1)
    first = Net()
    t = _fit(tmp_path / "a", first, max_epochs=3, max_steps=stop_at, accumulate_grad_batches=3)
    t.save_checkpoint(tmp_path / "ck")
    torch.manual_seed(99)
    resumed = Net()
    _fit(
        tmp_path / "b", resumed, max_epochs=3, ckpt_path=tmp_path / "ck", accumulate_grad_batches=3
    )
    _assert_same(full, resumed)


def test_signal_inside_an_accumulation_window_finishes_the_window_then_saves(tmp_path, capsys):
    full = _uninterrupted(tmp_path, accumulate_grad_batches=3)

    class SignalInsideWindow(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.current_epoch == 1 and batch_idx == 4:  # window = batches 3, 4, 5
                os.kill(os.getpid(), signal.SIGTERM)

    torch.manual_seed(1)
    first = Net()
    with pytest.raises(SystemExit) as info:
        _fit(
            tmp_path / "a",
            first,
            max_epochs=3,
            accumulate_grad_batches=3,
            callbacks=[SignalInsideWindow()],
        )
    assert info.value.code == 0
    assert "received SIGTERM" in capsys.readouterr().err
    saved = list((tmp_path / "a" / "checkpoints").iterdir())
    assert [p.name for p in saved] == ["preempted-epoch=1-step=6"]  # after batch 5's step
    torch.manual_seed(99)
    resumed = Net()
    _fit(tmp_path / "a", resumed, max_epochs=3, accumulate_grad_batches=3, ckpt_path="last")
    _assert_same(full, resumed)


def test_resume_with_two_dataloader_workers(tmp_path):
    full = _uninterrupted(tmp_path, loader_workers=2)
    torch.manual_seed(1)
    t = _fit(tmp_path / "a", Net(), loader_workers=2, max_epochs=3, max_steps=14)
    t.save_checkpoint(tmp_path / "ck")
    torch.manual_seed(99)
    resumed = Net()
    _fit(tmp_path / "b", resumed, loader_workers=2, max_epochs=3, ckpt_path=tmp_path / "ck")
    _assert_same(full, resumed)


def test_last_resolves_the_newest_valid_checkpoint_and_skips_a_torn_one(tmp_path):
    root = tmp_path / "run"
    torch.manual_seed(1)
    _fit(
        root,
        Net(),
        max_epochs=1,
        callbacks=[ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)],
        enable_checkpointing=True,
    )
    ckpts = root / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "epoch=0-step=3",
        "epoch=0-step=6",
        "epoch=0-step=9",
    ]
    (ckpts / "epoch=0-step=9" / "state.json").write_text("{}")  # corrupt the newest
    steps_run = []

    class Count(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            steps_run.append(trainer.global_step)

    with pytest.warns(UserWarning, match="step=9"):
        t = quiet_trainer(root, max_epochs=1, callbacks=[Count()])
        t.fit(Net(), data(), ckpt_path="last")
    assert steps_run == [7, 8, 9, 10]  # resumed after step 6


def test_last_without_any_checkpoint_starts_fresh_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="starting from scratch"):
        t = _fit(tmp_path, Net(), max_epochs=1, ckpt_path="last")
    assert t.global_step == 10


def test_callbacks_datamodule_hparams_and_user_entries_survive(tmp_path):
    class Stateful(Callback):
        def __init__(self):
            self.count = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.count += 1

        def state_dict(self):
            return {"count": self.count}

        def load_state_dict(self, state):
            self.count = state["count"]

    class Data(trainer.DataModule):
        def __init__(self):
            super().__init__()
            self.seen = 0

        def train_dataloader(self):
            return data()

        def state_dict(self):
            return {"seen": 7}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    loaded = {}

    class WithExtras(Net):
        def __init__(self, width: int = 16):
            super().__init__()
            self.save_hyperparameters()

        def on_save_checkpoint(self, checkpoint):
            checkpoint["mine"] = {"note": "hi", "table": torch.arange(3)}

        def on_load_checkpoint(self, checkpoint):
            loaded.update(checkpoint["mine"], hparams=checkpoint["hyper_parameters"])

    torch.manual_seed(1)
    callback = Stateful()
    t = quiet_trainer(tmp_path, max_steps=4, callbacks=[callback])
    t.fit(WithExtras(width=8), datamodule=Data())
    t.save_checkpoint(tmp_path / "ck")
    callback2, datamodule2 = Stateful(), Data()
    t2 = quiet_trainer(tmp_path, max_steps=6, callbacks=[callback2])
    t2.fit(WithExtras(width=8), datamodule=datamodule2, ckpt_path=tmp_path / "ck")
    assert callback2.count == 4 + 2 and datamodule2.seen == 7
    assert (
        loaded["note"] == "hi"
        and torch.equal(loaded["table"], torch.arange(3))
        and loaded["hparams"] == {"width": 8}
    )


def test_model_checkpoint_top_k_best_and_validate_with_best(tmp_path):
    class Scored(LinearModule):
        def validation_step(self, batch, batch_idx):
            self.log("score", float([3, 1, 2, 0, 5][min(self.current_epoch, 4)]))

    callback = ModelCheckpoint(
        monitor="score", mode="min", save_top_k=2, save_last=True, filename="{epoch}-{score:.1f}"
    )
    t = quiet_trainer(tmp_path, max_epochs=5, callbacks=[callback], enable_checkpointing=True)
    t.fit(Scored(), make_loader(n=8), make_loader(n=8))
    from trainer.checkpoint import read_checkpoint

    # The 2 best scores (0.0 at epoch 3, 1.0 at epoch 1) are kept; the newest save (epoch 4, score
    # 5.0, not in the top 2) lives on only as `last`: a real checkpoint folder, not a symlink.
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch=1-score=1.0", "epoch=3-score=0.0", "last"]
    assert (
        callback.best_model_path.endswith("epoch=3-score=0.0")
        and float(callback.best_model_score) == 0.0
    )
    last = tmp_path / "checkpoints" / "last"
    assert last.is_dir() and not last.is_symlink() and Path(callback.last_model_path) == last
    last_checkpoint = read_checkpoint(last)
    assert last_checkpoint["epoch"] == 4 and last_checkpoint["global_step"] == t.global_step
    assert torch.equal(last_checkpoint["state_dict"]["net.weight"], t.module.net.weight)

    best_weights = read_checkpoint(callback.best_model_path)["state_dict"]
    assert not torch.equal(t.module.net.weight, best_weights["net.weight"])  # trained past the best
    t.validate(ckpt_path="best", dataloaders=make_loader(n=8))
    assert torch.equal(t.module.net.weight, best_weights["net.weight"])
    with pytest.raises(trainer.ConfigurationError, match="ckpt_path='best'"):
        quiet_trainer(tmp_path).validate(LinearModule(), make_loader(), ckpt_path="best")


def test_model_checkpoint_monitor_missing_names_logged_metrics(tmp_path):
    t = quiet_trainer(
        tmp_path,
        max_epochs=1,
        callbacks=[ModelCheckpoint(monitor="val/acc")],
        enable_checkpointing=True,
    )
    with pytest.raises(
        trainer.ConfigurationError,
        match=r"monitor='val/acc'.*logged metrics: \['train/loss', 'val/loss'\]",
    ):
        t.fit(LinearModule(), make_loader(), make_loader())


def test_filename_template_with_metric_values(tmp_path):
    callback = ModelCheckpoint(filename="epoch={epoch}-step={step}-{val/loss:.3f}")
    assert (
        callback.format_name(2, 40, {"val/loss": torch.tensor(0.12345)})
        == "epoch=2-step=40-val_loss=0.123"
    )
    with pytest.raises(trainer.ConfigurationError, match="nope"):
        ModelCheckpoint(filename="{nope}").format_name(0, 0, {})


def test_on_exception_checkpoint_and_the_run_after_the_crash(tmp_path):
    """The checkpoint holds the position of the batch that failed (it never stepped), and the
    same script run again (fit without ckpt_path) resumes from it, as Lightning's does: the
    failed batch is trained then, and the weights end as an uninterrupted run's."""
    from trainer.callbacks import OnExceptionCheckpoint

    class Boom(Net):
        crash_at = 14  # inside epoch 1 (10 batches per epoch)

        def training_step(self, batch, batch_idx):
            if self.global_step == self.crash_at:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    def run(crash_at: int) -> tuple[trainer.Trainer, Net]:
        torch.manual_seed(1)
        module = Boom()
        module.crash_at = crash_at
        callbacks = [OnExceptionCheckpoint(tmp_path / "exc")]
        # a Checkpoint callback needs enable_checkpointing, as in Lightning
        fit = quiet_trainer(tmp_path, max_epochs=3, enable_checkpointing=True, callbacks=callbacks)
        fit.fit(module, data())
        return fit, module

    with pytest.raises(RuntimeError, match="boom"):
        run(crash_at=14)
    from trainer.checkpoint import read_checkpoint

    saved = read_checkpoint(tmp_path / "exc" / "on_exception")
    assert saved["global_step"] == 14 and saved["progress"]["batch_idx"] == 4  # not 5
    with pytest.warns(UserWarning, match="OnExceptionCheckpoint resumes"):
        again, resumed = run(crash_at=-1)
    assert again.ckpt_path == str(tmp_path / "exc" / "on_exception")
    assert again.global_step == 30
    _assert_same(_uninterrupted(tmp_path), resumed)


def test_weights_file_and_legacy_pickle_as_ckpt_path_for_test(tmp_path):
    module = LinearModule()
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    other = LinearModule()
    quiet_trainer(tmp_path).test(other, make_loader(), ckpt_path=tmp_path / "weights.pt")
    _assert_same(module, other)
    with pytest.raises(trainer.CheckpointError, match="do not fit"):
        torch.save({"net.weight": torch.zeros(3, 3)}, tmp_path / "wrong.pt")
        quiet_trainer(tmp_path).test(LinearModule(), make_loader(), ckpt_path=tmp_path / "wrong.pt")


def test_resumed_csv_logger_continues_the_same_run_without_duplicate_steps(tmp_path):
    torch.manual_seed(1)
    t = trainer.Trainer(
        max_steps=6,
        default_root_dir=str(tmp_path),
        log_every_n_steps=2,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    t.fit(Net(), data())
    t2 = trainer.Trainer(
        max_steps=12,
        default_root_dir=str(tmp_path),
        log_every_n_steps=2,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    t2.fit(Net(), data(), ckpt_path="last")
    assert t2.logger.version == 0
    with open(tmp_path / "trainer_logs" / "version_0" / "metrics.csv", newline="") as file:
        steps = [int(row["step"]) for row in csv.DictReader(file)]
    assert steps == sorted(set(steps)) and steps[-1] == 11  # optimizer step 12, logged at 11
    assert not (tmp_path / "trainer_logs" / "version_1").exists()


def _run_job(root: Path, mode: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(JOB.parents[2]), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, str(JOB), str(root), mode],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.slow
def test_sigterm_subprocess_saves_exits_zero_and_resumes_exactly(tmp_path):
    full = _run_job(tmp_path / "full", "full")
    assert full.returncode == 0, full.stderr
    stopped = _run_job(tmp_path / "run", "signal")
    assert stopped.returncode == 0, stopped.stderr
    assert "received SIGTERM; saved a checkpoint at step 13" in stopped.stderr
    assert not (tmp_path / "run" / "final-signal.safetensors").exists()
    resumed = _run_job(tmp_path / "run", "resume")
    assert resumed.returncode == 0, resumed.stderr
    a = load_file(str(tmp_path / "full" / "final-full.safetensors"))
    b = load_file(str(tmp_path / "run" / "final-resume.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_resumes_from_it_exactly(tmp_path):
    full = _run_job(tmp_path / "full", "full")
    assert full.returncode == 0, full.stderr
    killed = _run_job(tmp_path / "run", "kill")
    assert killed.returncode == -signal.SIGKILL
    resumed = _run_job(tmp_path / "run", "resume")
    assert resumed.returncode == 0, resumed.stderr
    a = load_file(str(tmp_path / "full" / "final-full.safetensors"))
    b = load_file(str(tmp_path / "run" / "final-resume.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_self_signal_helper_is_used():  # keeps the helper importable for the subprocess job
    assert SelfSignal(1, signal.SIGTERM).step == 1


def test_every_n_epochs_and_save_weights_only(tmp_path):
    from trainer.checkpoint import read_checkpoint

    callback = ModelCheckpoint(every_n_epochs=2, save_top_k=-1, save_weights_only=True)
    t = quiet_trainer(tmp_path, max_epochs=4, callbacks=[callback], enable_checkpointing=True)
    t.fit(LinearModule(), make_loader(n=8))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch=1-step=4", "epoch=3-step=8"]
    weights_only = read_checkpoint(tmp_path / "checkpoints" / "epoch=3-step=8")
    assert "optimizer_states" not in weights_only and "progress" not in weights_only
    assert set(weights_only["state_dict"]) == {"net.weight", "net.bias"}


def test_train_time_interval_saves_on_time(tmp_path, monkeypatch):
    import datetime as dt
    import types

    from trainer.callbacks import model_checkpoint

    # ModelCheckpoint's clock advances 30 ms per training step and not otherwise, so the saves
    # do not depend on how loaded the machine is (with a real sleep, a slow save made every step
    # due).
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(
        model_checkpoint, "time", types.SimpleNamespace(monotonic=lambda: clock.now)
    )

    class Slow(LinearModule):
        def training_step(self, batch, batch_idx):
            clock.now += 0.03
            return super().training_step(batch, batch_idx)

    callback = ModelCheckpoint(train_time_interval=dt.timedelta(seconds=0.05), save_top_k=-1)
    t = quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback], enable_checkpointing=True)
    t.fit(Slow(), make_loader(n=32))  # 8 steps of 30 ms: 60 ms >= 50 ms at every second step
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["epoch=0-step=2", "epoch=0-step=4", "epoch=0-step=6", "epoch=0-step=8"]


def test_sigusr1_saves_and_exits_zero_like_sigterm(tmp_path, capsys):
    torch.manual_seed(1)
    with pytest.raises(SystemExit) as info:
        _fit(tmp_path, Net(), max_epochs=3, callbacks=[SelfSignal(4, signal.SIGUSR1)])
    assert info.value.code == 0 and "received SIGUSR1" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["preempted-epoch=0-step=4"]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is removed again


class _Plateau(Net):
    """Validates, and lowers its learning rate on a plateau of val_loss that never ends (an
    improvement must be by 10): the first step records the best, each later one halves the
    rate, so a lost or doubled step shows."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=0.5, patience=0, threshold=10, threshold_mode="abs"
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"},
        }


@pytest.mark.parametrize(
    "val_check_interval",
    [1.0, 0.5],
    ids=["saved in on_train_epoch_end", "saved after the epoch's last validation"],
)
def test_resume_from_a_checkpoint_of_the_epoch_end_steps_the_plateau_once(
    tmp_path, val_check_interval
):
    """ModelCheckpoint(monitor="val_loss") saves at the end of epoch 0 either in
    on_train_epoch_end (validation once per epoch) or right after the epoch's last validation
    (several per epoch): both before the epoch's ReduceLROnPlateau step. Resuming from it used
    to go on with epoch 1 without that step (the learning rate stayed twice as high, as it does
    in Lightning); now the resumed run equals the uninterrupted one."""

    def run(folder: Path, ckpt_path: Path | None = None, *callbacks: Callback) -> Net:
        torch.manual_seed(1 if ckpt_path is None else 99)
        module = _Plateau()
        fit = quiet_trainer(
            folder,
            max_epochs=3,
            num_sanity_val_steps=0,
            val_check_interval=val_check_interval,
            enable_checkpointing=bool(callbacks),
            callbacks=list(callbacks),
        )
        fit.fit(module, data(), data(), ckpt_path=ckpt_path)
        module.final_lr = fit.optimizers[0].param_groups[0]["lr"]
        return module

    saving = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=-1)
    full = run(tmp_path / "full", None, saving)
    resumed = run(tmp_path / "resumed", next((tmp_path / "ck").glob("epoch=0-step=10*")))
    assert full.final_lr == pytest.approx(0.02 * 0.5**2)
    assert resumed.final_lr == full.final_lr
    _assert_same(full, resumed)


def test_fit_refuses_to_resume_from_a_weights_only_checkpoint(tmp_path):
    # Lightning: "Trying to restore optimizer state but checkpoint contains only the model".
    first = quiet_trainer(tmp_path, max_epochs=2)
    first.fit(LinearModule(), make_loader(n=8))
    first.save_checkpoint(tmp_path / "weights", weights_only=True)
    module = LinearModule()
    before = module.net.weight.detach().clone()
    with pytest.raises(trainer.errors.CheckpointError, match="holds the weights only"):
        quiet_trainer(tmp_path, max_epochs=4).fit(
            module, make_loader(n=8), ckpt_path=tmp_path / "weights"
        )
    assert torch.equal(module.net.weight, before)  # nothing was loaded


def test_fit_refuses_a_checkpoint_past_max_epochs(tmp_path):
    # Lightning: "You restored a checkpoint with current_epoch=4, but you have set
    # Trainer(max_epochs=2)." (saved after fit: the 4 epochs are done)
    first = quiet_trainer(tmp_path, max_epochs=4)
    first.fit(LinearModule(), make_loader(n=8))
    first.save_checkpoint(tmp_path / "four")
    with pytest.raises(trainer.errors.ConfigurationError, match=r"current_epoch=4.*max_epochs=2"):
        quiet_trainer(tmp_path, max_epochs=2).fit(
            LinearModule(), make_loader(n=8), ckpt_path=tmp_path / "four"
        )
    resumed = quiet_trainer(tmp_path, max_epochs=4)  # all done: nothing left, no error
    resumed.fit(LinearModule(), make_loader(n=8), ckpt_path=tmp_path / "four")
    assert resumed.global_step == first.global_step


def test_a_ckpt_whose_state_dict_is_not_a_mapping_is_refused(tmp_path):
    torch.save({"state_dict": [1, 2], "epoch": 0, "global_step": 0}, tmp_path / "bad.ckpt")
    with pytest.raises(trainer.errors.CheckpointError, match="state_dict"):
        LinearModule.load_from_checkpoint(tmp_path / "bad.ckpt")
    with pytest.raises(trainer.errors.CheckpointError, match="state_dict"):
        quiet_trainer(tmp_path).validate(
            LinearModule(), make_loader(n=8), ckpt_path=tmp_path / "bad.ckpt"
        )
