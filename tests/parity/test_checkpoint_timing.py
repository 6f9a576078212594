"""Parity by difference: when ModelCheckpoint saves, how it names and ranks, on Lightning and trainer.

Each scenario runs one module recipe with one ModelCheckpoint configuration on
``lightning.pytorch`` 2.6 and on trainer and compares the checkpoints kept (name without
Lightning's ``.ckpt``: trainer writes directories, a deliberate difference) with the global step
each holds, and the callback's public attributes: ``best_model_path``, ``best_model_score``,
``kth_best_model_path``, ``kth_value``, ``current_score``, ``best_k_models`` and
``last_model_path``. The scores are a function of the global step, so both frameworks rank the
same values; no expected value is written by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

pl = pytest.importorskip("lightning.pytorch")


def _loader(n: int = 8, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)


def _module(base: type, *, fail_at_step: int | None = None) -> Any:
    class Scored(base):  # type: ignore[misc, valid-type]
        """Validation logs ``score`` (a function of the step); the epoch end logs ``epoch_score``."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if self.global_step == fail_at_step:
                raise RuntimeError("failing on purpose")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("score", float((self.global_step * 7) % 5))

        def on_train_epoch_end(self):
            self.log("epoch_score", float((self.current_epoch * 3) % 4))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Scored()


def _stem(path: str) -> str:
    return Path(path).name.removesuffix(".ckpt")


def _facts(callback: Any, folder: Path, framework: str) -> dict[str, Any]:
    """What a user reads after fit: the checkpoints kept and the callback's attributes."""

    def number(value: Any) -> float | None:
        return None if value is None else round(float(value), 5)

    if not folder.exists():
        kept = {}
    elif framework == "lightning":
        kept = {
            path.stem: torch.load(path, weights_only=False)["global_step"]
            for path in folder.glob("*.ckpt")
        }
    else:
        kept = {
            path.name: json.loads((path / "manifest.json").read_text())["global_step"]
            for path in folder.iterdir()
            if not path.name.startswith(".")
        }
    return {
        "kept": kept,
        "best_model_path": _stem(callback.best_model_path),
        "best_model_score": number(callback.best_model_score),
        "kth_best_model_path": _stem(callback.kth_best_model_path),
        "kth_value": number(callback.kth_value),
        "current_score": number(callback.current_score),
        "best_k_models": {_stem(p): number(s) for p, s in callback.best_k_models.items()},
        "last_model_path": _stem(callback.last_model_path),
        # a user's `score.item()` works only on a tensor: the kinds must match too
        "score_types": sorted(
            {
                type(value).__name__
                for value in [
                    *callback.best_k_models.values(),
                    callback.best_model_score,
                    callback.kth_value,
                    callback.current_score,
                ]
            }
        ),
    }


def _run(
    framework: str,
    folder: Path,
    checkpoint: dict[str, Any],
    *,
    validate: bool = True,
    fail_at_step: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    options = {
        "max_epochs": 4,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        **options,
    }
    val = [_loader(4, seed=1)] if validate else []
    if framework == "lightning":
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, **checkpoint)
        fit = pl.Trainer(callbacks=[callback], accelerator="cpu", **options)
        module = _module(pl.LightningModule, fail_at_step=fail_at_step)
    else:
        callback = trainer.callbacks.ModelCheckpoint(dirpath=folder, **checkpoint)
        fit = trainer.Trainer(callbacks=[callback], **options)
        module = _module(trainer.TrainModule, fail_at_step=fail_at_step)
    if fail_at_step is None:
        fit.fit(module, _loader(), *val)
    else:
        with pytest.raises(RuntimeError, match="failing on purpose"):
            fit.fit(module, _loader(), *val)
    return _facts(callback, folder, framework)


def _assert_same(tmp_path: Path, checkpoint: dict[str, Any], **options: Any) -> dict[str, Any]:
    expected = _run("lightning", tmp_path / "lightning", checkpoint, **options)
    assert expected["kept"], "Lightning kept no checkpoint: the scenario is wrong"
    received = _run("trainer", tmp_path / "trainer", checkpoint, **options)
    assert received == expected
    return received


@pytest.mark.parametrize(
    ("checkpoint", "options"),
    [
        # None: at the end of the training epoch (validation runs at every epoch's end) ...
        ({"monitor": "epoch_score", "mode": "max", "save_top_k": 2}, {}),
        # ... after each validation when there are several per epoch ...
        ({"monitor": "score", "save_top_k": 2}, {"val_check_interval": 0.5}),
        # ... or when not every epoch validates (epochs 1 and 3 only) ...
        ({"monitor": "score", "save_top_k": -1}, {"check_val_every_n_epoch": 2}),
        # ... and at the training epoch end without validation.
        ({"monitor": "epoch_score", "save_top_k": 2, "mode": "max"}, {"validate": False}),
        # Forced either way.
        ({"save_on_train_epoch_end": True, "save_top_k": -1}, {"check_val_every_n_epoch": 2}),
        ({"save_on_train_epoch_end": False, "save_top_k": -1}, {"validate": False}),
        # A step trigger waits for the monitored validation metric, and for the validation
        # that follows the epoch's last batch.
        ({"monitor": "score", "every_n_train_steps": 2, "save_top_k": 3}, {}),
        ({"monitor": "score", "every_n_train_steps": 3, "save_top_k": -1}, {}),
        # monitor="step" keeps the newest; kth_best_model_path follows the ranking.
        ({"monitor": "step", "mode": "max", "save_top_k": 2}, {}),
    ],
    ids=[
        "epoch-end-default",
        "fractional-val",
        "val-every-2",
        "no-val",
        "forced-epoch-end",
        "forced-val-end-no-val",
        "steps-deferred",
        "steps-last-batch",
        "monitor-step",
    ],
)
def test_when_and_what_is_kept(
    tmp_path: Path, checkpoint: dict[str, Any], options: dict[str, Any]
) -> None:
    if checkpoint.get("save_on_train_epoch_end") is False:
        # Never saved: no validation ever ends. Lightning keeps nothing either.
        received = _run("trainer", tmp_path / "trainer", checkpoint, **options)
        expected = _run("lightning", tmp_path / "lightning", checkpoint, **options)
        assert received == expected and not received["kept"]
        return
    _assert_same(tmp_path, checkpoint, **options)


@pytest.mark.parametrize(
    "checkpoint",
    [
        {"filename": "model", "monitor": "score", "save_top_k": 2},
        {"monitor": None, "save_top_k": -1},
        {"monitor": None, "save_top_k": 1, "save_last": True},
    ],
    ids=["same-name-top2", "keep-all", "newest+last"],
)
def test_version_counter_on_a_second_run_in_the_same_folder(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """The second fit finds the first one's names taken: ``-v1`` (and ``model-v1``, ...)."""
    for framework in ("lightning", "trainer"):
        folder = tmp_path / framework
        _run(framework, folder, checkpoint, max_epochs=2)
    expected = _run("lightning", tmp_path / "lightning", checkpoint, max_epochs=2)
    received = _run("trainer", tmp_path / "trainer", checkpoint, max_epochs=2)
    assert received == expected
    assert any("-v1" in name for name in received["kept"])


def test_version_counter_off_replaces(tmp_path: Path) -> None:
    checkpoint = {"monitor": "score", "save_top_k": -1, "enable_version_counter": False}
    for framework in ("lightning", "trainer"):
        _run(framework, tmp_path / framework, checkpoint, max_epochs=2)
    expected = _run("lightning", tmp_path / "lightning", checkpoint, max_epochs=2)
    received = _run("trainer", tmp_path / "trainer", checkpoint, max_epochs=2)
    assert received == expected and not any("-v" in name for name in received["kept"])


def test_save_on_exception(tmp_path: Path) -> None:
    checkpoint = {"save_on_exception": True, "filename": "{step}", "save_top_k": -1}
    received = _assert_same(tmp_path, checkpoint, fail_at_step=6)
    assert received["kept"]["step=6"] == 6


@pytest.mark.parametrize("options", [{}, {"val_check_interval": 3}])
def test_with_accumulation_only_the_saves_inside_a_window_differ(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """docs/migration/lightning.md: a step save that waited for the monitored metric is made by
    Lightning on the next batch, inside an accumulation window, and not by trainer (a resume
    could not continue the window). With 2 batches a window and 4 an epoch, epoch E's steps are
    2E+1 and 2E+2, so Lightning's ``epoch=E-step=2E`` was taken one batch into epoch E."""
    checkpoint = {"monitor": "score", "every_n_train_steps": 1, "save_top_k": -1}
    options = {"accumulate_grad_batches": 2, **options}
    expected = _run("lightning", tmp_path / "lightning", checkpoint, **options)
    received = _run("trainer", tmp_path / "trainer", checkpoint, **options)
    inside_a_window = {
        name
        for name, step in expected["kept"].items()
        if step % 2 == 0 and name.startswith(f"epoch={step // 2}-")
    }
    assert inside_a_window, "Lightning saved nothing inside a window: the scenario is wrong"
    assert received["kept"] == {
        name: step for name, step in expected["kept"].items() if name not in inside_a_window
    }
    assert all(step % 2 == 1 or name.startswith(f"epoch={step // 2 - 1}-")
               for name, step in received["kept"].items())  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"save_top_k": 2}, "save_top_k=2, monitor=None"),
        ({"every_n_train_steps": 2, "every_n_epochs": 1}, "mutually exclusive"),
        ({"mode": "average"}, "mode='average'"),
        ({"save_top_k": -2}, "save_top_k=-2"),
    ],
)
def test_the_arguments_lightning_refuses_are_refused(
    arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception, match="Combination|Invalid|mode|save_top_k"):
        pl.callbacks.ModelCheckpoint(**arguments)
    with pytest.raises(trainer.ConfigurationError, match=message):
        trainer.callbacks.ModelCheckpoint(**arguments)


def test_constructor_signature_matches_lightning() -> None:
    import inspect

    ours = inspect.signature(trainer.callbacks.ModelCheckpoint.__init__).parameters
    theirs = inspect.signature(pl.callbacks.ModelCheckpoint.__init__).parameters
    assert list(ours) == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default, name
    assert not math.isnan(float(trainer.callbacks.ModelCheckpoint().kth_value))
