"""Parity by difference: what ``DeviceStatsMonitor`` logs, on lightning.pytorch 2.6 and on trainer.

Each scenario fits a regression module with validation (sanity check included), then runs
``validate`` and ``test``, with a logger that keeps every row. Compared: which hooks write a row
(the keys: ``DeviceStatsMonitor.<hook>/<stat>``) and at which step. The values are the machine's
(memory and CPU use now), so they are only checked to be percentages. Lightning's run is the
expected value.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, regression, rows_logger

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("psutil")  # Lightning's CPU statistics need it


def _stopper(fw: Any, at_batch: int) -> Any:
    class Stop(fw.Callback):  # type: ignore[misc, valid-type]
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == at_batch:
                trainer.should_stop = True

    return Stop()


def _run(
    fw: Any, options: dict[str, Any], cpu_stats: bool | None = None, stop_at: int | None = None
) -> list[Any]:
    logger = rows_logger(fw)
    monitor = fw.callbacks.DeviceStatsMonitor(cpu_stats=cpu_stats)
    if stop_at is not None:  # the batches after should_stop log whatever their step
        options = {**options, "callbacks": [_stopper(fw, stop_at)], "min_epochs": 0}

    class Tested(regression(fw.Module)):
        def test_step(self, batch, batch_idx):
            pass

    module = Tested()
    options = {**options, "callbacks": [*options.get("callbacks", []), monitor]}
    fit = fw.trainer(**quiet(logger=logger, **options))
    fit.fit(module, loader(12), loader(6))
    fit.validate(module, loader(8), **fw.eval_options)
    fit.test(module, loader(6), **fw.eval_options)
    rows = []
    for step, metrics in logger.rows:
        stats = {k: v for k, v in metrics.items() if k.startswith("DeviceStatsMonitor.")}
        if stats:
            assert all(0.0 <= float(v) <= 100.0 for v in stats.values()), stats
            rows.append((step, sorted(stats)))
    return rows


@pytest.mark.parametrize(
    "options",
    [
        {"max_epochs": 2, "log_every_n_steps": 2},
        {"max_epochs": 1, "log_every_n_steps": 1, "accumulate_grad_batches": 2},
        {"max_epochs": 2, "log_every_n_steps": 3, "val_check_interval": 4},
    ],
)
def test_device_stats_rows_equal_lightnings(options: dict[str, Any]) -> None:
    expected = _run(LIGHTNING, options)
    actual = _run(TRAINER, options)
    hooks = {key.split("/")[0] for _, keys in expected for key in keys}
    assert "DeviceStatsMonitor.on_validation_batch_end" in hooks  # the scenario logs each kind
    assert actual == expected


def test_the_batches_after_should_stop_log_as_in_lightning() -> None:
    options = {"max_epochs": 2, "log_every_n_steps": 4, "accumulate_grad_batches": 2}
    expected = _run(LIGHTNING, options, stop_at=2)
    assert _run(TRAINER, options, stop_at=2) == expected


def test_no_cpu_statistics_with_cpu_stats_false() -> None:
    options = {"max_epochs": 1, "log_every_n_steps": 1}
    assert _run(LIGHTNING, options, cpu_stats=False) == []
    assert _run(TRAINER, options, cpu_stats=False) == []


def test_fit_without_a_logger_is_refused_as_in_lightning() -> None:
    for fw in (LIGHTNING, TRAINER):
        fit = fw.trainer(**quiet(max_epochs=1, callbacks=[fw.callbacks.DeviceStatsMonitor()]))
        with pytest.raises(Exception, match="logger"):
            fit.fit(regression(fw.Module)(), loader(4))
