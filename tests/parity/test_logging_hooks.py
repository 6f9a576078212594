"""Parity by difference: ``self.log`` per hook, names two stages or hooks share, batch sizes.

Each scenario runs one module on lightning.pytorch 2.6 and on trainer and compares what each
published (``callback_metrics`` while fitting and after, ``logged_metrics``, the rows a logger
received, ``metrics.csv``'s header) or which error class each raised. Lightning's run is the
expected value.
"""

from __future__ import annotations

import csv
import enum
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import trainer
from tests.parity.frameworks import (
    BOTH,
    LIGHTNING,
    TRAINER,
    Framework,
    quiet,
    rows_logger,
    snapshot,
)

pl = pytest.importorskip("lightning.pytorch")
MisconfigurationException = pytest.importorskip(
    "lightning.fabric.utilities.exceptions"
).MisconfigurationException


def _loader(n: int = 6, batch_size: int = 2) -> DataLoader:
    x = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) / 10
    return DataLoader(list(zip(x, x.sum(dim=1, keepdim=True), strict=True)), batch_size=batch_size)


def _module(fw: Framework, **methods: Any) -> Any:
    """A linear regression module of ``fw`` with ``methods`` added (each ``f(self, ...)``)."""

    def __init__(self: Any) -> None:
        fw.Module.__init__(self)
        torch.manual_seed(0)
        self.net = torch.nn.Linear(2, 1)

    def loss(self: Any, batch: Any) -> torch.Tensor:
        x, y = batch[-2], batch[-1]
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self: Any, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def configure_optimizers(self: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    attributes = {
        "__init__": __init__,
        "loss": loss,
        "training_step": training_step,
        "configure_optimizers": configure_optimizers,
        **methods,
    }
    return type("Module", (fw.Module,), attributes)()


def _error_class(fw: Framework, run: Any) -> str:
    """``"raises"`` when ``run()`` raised the framework's configuration error, else ``"ok"``."""
    expected = MisconfigurationException if fw is LIGHTNING else trainer.ConfigurationError
    try:
        run()
    except expected:
        return "raises"
    return "ok"


# ---- a name logged by training and by validation ----------------------------------------------
def _train_and_val_share_a_name(fw: Framework, root: Path, **options: Any) -> dict[str, Any]:
    seen: list[tuple[int, str, float]] = []

    def training_step(self: Any, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("same", float(batch_idx + 1))
        self.log("both", float(batch_idx + 1), on_step=False, on_epoch=True)
        return self.loss(batch)

    def validation_step(self: Any, batch: Any, batch_idx: int) -> None:
        self.log("same", 100.0)
        self.log("both", 200.0)

    def read(name: str) -> Any:
        def hook(self: Any, trainer_: Any, module: Any, *args: Any) -> None:
            metrics = trainer_.callback_metrics
            seen.append((trainer_.current_epoch, name, round(float(metrics.get("same", -1)), 4)))
            seen.append((trainer_.current_epoch, name, round(float(metrics.get("both", -1)), 4)))

        return hook

    hooks = ("on_train_batch_start", "on_train_batch_end", "on_train_epoch_end")
    reader = type("Reader", (fw.Callback,), {name: read(name) for name in hooks})()
    logger = rows_logger(fw)
    module = _module(fw, training_step=training_step, validation_step=validation_step)
    fit = fw.trainer(
        **quiet(logger=logger, callbacks=[reader], log_every_n_steps=1, **options),
        default_root_dir=str(root),
    )
    fit.fit(module, _loader(), _loader(4))
    return {
        "seen": seen,
        "callback_metrics": snapshot(fit.callback_metrics),
        "logged_metrics": snapshot(fit.logged_metrics),
        "rows": logger.rows,
    }


@pytest.mark.parametrize(
    "options",
    [
        {"max_epochs": 3, "check_val_every_n_epoch": 2, "num_sanity_val_steps": 0},
        {"max_epochs": 2, "val_check_interval": 2, "num_sanity_val_steps": 0},
        {"max_epochs": 1},
    ],
    ids=["validation-every-second-epoch", "validation-mid-epoch", "validation-last"],
)
def test_a_name_training_and_validation_both_log_reads_as_the_latest(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """Training's step values win again from the next training batch on, its epoch values from
    on_train_epoch_end on; until then validation's value shows (Lightning's dicts take the
    running stage's values at each batch and epoch end)."""
    expected, received = (
        _train_and_val_share_a_name(fw, tmp_path / fw.name, **options) for fw in BOTH
    )
    assert received == expected


# ---- what an evaluation's epoch-end hooks read -------------------------------------------------
def test_evaluation_epoch_end_hooks_read_the_epoch_that_just_ran(tmp_path: Path) -> None:
    """In ``on_validation_epoch_end`` / ``on_test_epoch_end`` (callback's and module's),
    ``callback_metrics`` and ``progress_bar_metrics`` hold the epoch that just ran (Lightning
    computes them live), for the sanity check, each fit epoch, ``validate`` and ``test``; a value
    logged there from them is that epoch's (it read the previous validation's, or nothing)."""

    def run(fw: Framework) -> dict[str, Any]:
        seen: list[Any] = []

        def read(where: str, trainer_: Any) -> None:
            metrics, bar = trainer_.callback_metrics, trainer_.progress_bar_metrics
            seen.append(
                (
                    where,
                    trainer_.sanity_checking,
                    trainer_.current_epoch,
                    round(float(metrics.get("val_loss", -1)), 4),
                    round(float(metrics.get("test_loss", -1)), 4),
                    round(float(bar.get("val_acc", -1)), 4),
                )
            )

        def eval_step(name: str) -> Any:
            def step(self: Any, batch: Any, batch_idx: int) -> None:
                value = self.loss(batch) + 100.0 * self.trainer.current_epoch
                self.log(f"{name}_loss", value)
                self.log("val_acc", float(batch_idx) + self.trainer.current_epoch, prog_bar=True)

            return step

        def module_epoch_end(self: Any) -> None:
            read("module", self.trainer)
            self.log("doubled", 2 * self.trainer.callback_metrics["val_loss"])

        reader = type(
            "Reader",
            (fw.Callback,),
            {
                "on_validation_epoch_end": lambda self, t, m: read("callback", t),
                "on_test_epoch_end": lambda self, t, m: read("callback-test", t),
            },
        )()
        module = _module(
            fw,
            validation_step=eval_step("val"),
            test_step=eval_step("test"),
            on_validation_epoch_end=module_epoch_end,
            on_test_epoch_end=lambda self: read("module-test", self.trainer),
        )
        fit = fw.trainer(**quiet(callbacks=[reader], max_epochs=2, num_sanity_val_steps=1))
        fit.fit(module, _loader(), _loader(4))
        validated = fit.validate(module, _loader(4), **fw.eval_options)
        tested = fit.test(module, _loader(4), **fw.eval_options)
        return {"seen": seen, "validate": snapshot(validated[0]), "test": snapshot(tested[0])}

    expected, received = (run(fw) for fw in BOTH)
    assert received == expected


# ---- a name logged in two hooks --------------------------------------------------------------
def test_a_name_logged_in_training_step_and_on_train_epoch_end_is_two_metrics(
    tmp_path: Path,
) -> None:
    """Each hook keeps its own values: ``x_step`` / ``x_epoch`` from training_step, ``x`` from
    on_train_epoch_end (which used to be merged into one, losing the epoch mean)."""

    def run(fw: Framework) -> dict[str, Any]:
        def training_step(self: Any, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("x", float(batch_idx), on_step=True, on_epoch=True)
            return self.loss(batch)

        def on_train_epoch_end(self: Any) -> None:
            self.log("x", 100.0)

        logger = rows_logger(fw)
        module = _module(fw, training_step=training_step, on_train_epoch_end=on_train_epoch_end)
        fit = fw.trainer(**quiet(logger=logger, max_epochs=2, log_every_n_steps=1))
        fit.fit(module, _loader())
        return {
            "callback": snapshot(fit.callback_metrics),
            "logged": snapshot(fit.logged_metrics),
            "rows": logger.rows,
        }

    expected, received = (run(fw) for fw in BOTH)
    assert received == expected
    assert received["logged"]["x"] == 100.0 and received["logged"]["x_epoch"] == 1.0


def test_a_name_logged_by_training_step_and_a_callbacks_batch_end_keeps_two_epoch_means() -> None:
    def run(fw: Framework) -> dict[str, float]:
        def training_step(self: Any, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("v", float(batch_idx), on_step=True, on_epoch=True)
            return self.loss(batch)

        def on_train_batch_end(self: Any, trainer_: Any, module: Any, *args: Any) -> None:
            module.log("v", 10.0, on_step=True, on_epoch=True)

        callback = type("Cb", (fw.Callback,), {"on_train_batch_end": on_train_batch_end})()
        module = _module(fw, training_step=training_step)
        fit = fw.trainer(**quiet(callbacks=[callback], max_epochs=1))
        fit.fit(module, _loader())
        return snapshot(fit.callback_metrics)

    expected, received = (run(fw) for fw in BOTH)
    assert received == expected


# ---- which hooks allow what ------------------------------------------------------------------
_EPOCH_HOOKS = (
    "on_train_start",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_validation_epoch_end",
)
_REFUSED = (
    "on_before_batch_transfer",
    "on_after_batch_transfer",
    "lr_scheduler_step",
    "on_validation_model_eval",
    "on_validation_model_train",
    "configure_optimizers",
)


def _logging_in(fw: Framework, hook: str, **log_options: Any) -> str:
    def log_there(self: Any, *args: Any) -> Any:
        self.log("a", 1.0, **log_options)
        if hook.endswith("batch_transfer"):
            return args[0]
        if hook == "lr_scheduler_step":
            args[0].step()
        if hook == "configure_optimizers":
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return None

    def validation_step(self: Any, batch: Any, batch_idx: int) -> None:
        self.log("val", self.loss(batch))

    def configure_optimizers(self: Any) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]

    methods = {"validation_step": validation_step, hook: log_there}
    if hook == "lr_scheduler_step":
        methods["configure_optimizers"] = configure_optimizers
    module = _module(fw, **methods)
    fit = fw.trainer(**quiet(max_epochs=1, num_sanity_val_steps=0))
    return _error_class(fw, lambda: fit.fit(module, _loader(), _loader(4)))


@pytest.mark.parametrize("hook", _EPOCH_HOOKS)
@pytest.mark.parametrize(
    "log_options", [{}, {"on_step": True}, {"on_epoch": False}], ids=["defaults", "step", "noepoch"]
)
def test_hooks_that_run_once_per_epoch_refuse_per_step_values(
    hook: str, log_options: dict[str, Any]
) -> None:
    assert _logging_in(TRAINER, hook, **log_options) == _logging_in(LIGHTNING, hook, **log_options)


@pytest.mark.parametrize("hook", _REFUSED)
def test_hooks_where_lightning_refuses_self_log(hook: str) -> None:
    assert _logging_in(LIGHTNING, hook) == "raises"
    assert _logging_in(TRAINER, hook) == "raises"


def test_predict_step_refuses_self_log() -> None:
    def run(fw: Framework) -> str:
        def predict_step(self: Any, batch: Any, batch_idx: int) -> Any:
            self.log("p", 1.0)
            return batch

        module = _module(fw, predict_step=predict_step)
        return _error_class(fw, lambda: fw.trainer(**quiet()).predict(module, _loader()))

    assert [run(fw) for fw in BOTH] == ["raises", "raises"]


# ---- values and batch sizes ------------------------------------------------------------------
@pytest.mark.parametrize("value", [True, np.float32(2.5), np.int64(3)], ids=["bool", "f32", "i64"])
def test_numbers_lightning_accepts(value: Any) -> None:
    def run(fw: Framework) -> dict[str, float]:
        def validation_step(self: Any, batch: Any, batch_idx: int) -> None:
            self.log("v", value)

        module = _module(fw, validation_step=validation_step)
        return fw.trainer(**quiet()).validate(module, _loader(), **fw.eval_options)[0]

    expected, received = (snapshot(run(fw)) for fw in BOTH)
    assert received == expected


def _keyed_loader(shape: str) -> DataLoader:
    """Batches of 2, 2 and 1 samples whose first element holds no tensor."""
    x = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    y = x.sum(dim=1, keepdim=True)
    ids = [f"sample-{i}" for i in range(5)]
    if shape == "ids-first":
        items = list(zip(ids, x, y, strict=True))
    elif shape == "dict":
        items = [{"name": n, "x": a, "y": b} for n, a, b in zip(ids, x, y, strict=True)]
    else:  # "no-tensor"
        items = ids
    return DataLoader(items, batch_size=2)


@pytest.mark.parametrize("shape", ["ids-first", "dict", "no-tensor"])
def test_the_epoch_mean_weights_by_the_first_tensor_found(shape: str) -> None:
    """The batch size is the first tensor's, found past strings; none at all is an error."""

    def run(fw: Framework) -> Any:
        def validation_step(self: Any, batch: Any, batch_idx: int) -> None:
            self.log("v", float(batch_idx))

        module = _module(fw, validation_step=validation_step)
        fit = fw.trainer(**quiet())
        result: list[Any] = []
        status = _error_class(
            fw, lambda: result.extend(fit.validate(module, _keyed_loader(shape), **fw.eval_options))
        )
        return status, [snapshot(r) for r in result]

    expected, received = (run(fw) for fw in BOTH)
    assert received == expected
    if shape != "no-tensor":
        assert received[1] == [{"v": round((0 * 2 + 1 * 2 + 2 * 1) / 5, 5)}]


def test_two_metric_objects_under_one_name_in_one_hook_are_refused() -> None:
    torchmetrics = pytest.importorskip("torchmetrics")

    def run(fw: Framework) -> str:
        def validation_step(self: Any, batch: Any, batch_idx: int) -> None:
            metric = self.first if batch_idx == 0 else self.second
            metric.update(torch.tensor(float(batch_idx)))
            self.log("m", metric)

        module = _module(fw, validation_step=validation_step)
        module.first, module.second = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()
        fit = fw.trainer(**quiet())
        return _error_class(fw, lambda: fit.validate(module, _loader(), **fw.eval_options))

    assert [run(fw) for fw in BOTH] == ["raises", "raises"]


# ---- what the loggers receive ----------------------------------------------------------------
def test_a_logged_step_metric_is_the_rows_step() -> None:
    """``self.log("step", epoch)`` at epoch end: that row is written at step = epoch, with no
    ``epoch`` key (Lightning's convention for epoch-indexed x axes)."""

    def run(fw: Framework) -> list[Any]:
        def on_validation_epoch_end(self: Any) -> None:
            self.log("step", float(self.current_epoch) * 100)
            self.log("score", float(self.current_epoch))

        def validation_step(self: Any, batch: Any, batch_idx: int) -> None:
            self.log("val", self.loss(batch))

        logger = rows_logger(fw)
        module = _module(
            fw, validation_step=validation_step, on_validation_epoch_end=on_validation_epoch_end
        )
        fit = fw.trainer(**quiet(logger=logger, max_epochs=3, num_sanity_val_steps=0))
        fit.fit(module, _loader(), _loader(4))
        return logger.rows

    expected, received = (run(fw) for fw in BOTH)
    assert received == expected
    assert [step for step, row in received if "score" in row] == [0, 100, 200]


class _Color(enum.Enum):
    RED = 1


def test_metrics_csv_columns_and_hparams_yaml_as_lightning_writes_them(tmp_path: Path) -> None:
    """metrics.csv's header is sorted by name; an Enum hyperparameter is written as its name."""

    def run(fw: Framework) -> tuple[list[str], str]:
        class Colored(type(_module(fw))):  # type: ignore[misc]
            def __init__(self, color: _Color = _Color.RED, lr: float = 0.1) -> None:
                super().__init__()
                self.save_hyperparameters()

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                loss = self.loss(batch)
                self.log("zeta", loss)
                self.log("alpha", loss, on_step=True, on_epoch=True)
                return loss

        module = Colored()
        logger = fw.loggers.CSVLogger(str(tmp_path / fw.name), name="run", version=0)
        fw.trainer(**quiet(logger=logger, max_epochs=1, log_every_n_steps=1)).fit(module, _loader())
        with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as file:
            header = next(csv.reader(file))
        with open(os.path.join(logger.log_dir, "hparams.yaml")) as file:
            hparams = sorted(file.read().split("\n"))
        return header, hparams

    expected, received = (run(fw) for fw in BOTH)
    assert received == expected
    assert "color: RED" in received[1]
