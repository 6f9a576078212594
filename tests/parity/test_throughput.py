"""Parity by difference: what ``ThroughputMonitor`` logs, on lightning.pytorch 2.6 and on trainer.

Each scenario fits a regression module (FLOPs per batch as its ``flops_per_batch`` attribute,
Lightning's way) with validation, then runs ``validate`` and ``test``, with a logger that keeps
every row. Compared: each row's step and keys, and the values that do not depend on the clock
(``*/batches``, ``*/samples``, ``*/lengths``, ``epoch``); rates and times are only checked to be
there (and positive). Lightning's run is the expected value.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet, regression, rows_logger

pl = pytest.importorskip("lightning.pytorch")


def _is_clock(key: str) -> bool:
    return key.endswith(("per_sec", "/time", "mfu"))


def _run(fw: Any, options: dict[str, Any]) -> list[Any]:
    logger = rows_logger(fw)
    monitor = fw.callbacks.ThroughputMonitor(
        batch_size_fn=lambda batch: batch[0].shape[0],
        length_fn=lambda batch: batch[0].numel(),
        window_size=2,
    )
    module = regression(fw.Module)()
    module.flops_per_batch = 100
    fit = fw.trainer(**quiet(logger=logger, max_epochs=2, callbacks=[monitor], **options))
    fit.fit(module, loader(14), loader(6))
    fit.validate(module, loader(8), **fw.eval_options)

    class Tested(regression(fw.Module)):
        def test_step(self, batch, batch_idx):
            pass

    tested = Tested()
    tested.flops_per_batch = 100
    fit.test(tested, loader(10), **fw.eval_options)
    rows = []
    for step, metrics in logger.rows:
        if not any(key.startswith(("train/", "validate/", "test/")) for key in metrics):
            continue
        assert all(metrics[key] > 0 for key in metrics if _is_clock(key)), metrics
        values = {k: (None if _is_clock(k) else round(float(v), 5)) for k, v in metrics.items()}
        rows.append((step, dict(sorted(values.items()))))
    return rows


@pytest.mark.parametrize(
    "options",
    [
        {"log_every_n_steps": 3},
        {"log_every_n_steps": 1, "accumulate_grad_batches": 2},
        {"log_every_n_steps": 2, "val_check_interval": 3},
    ],
)
def test_throughput_rows_equal_lightnings(options: dict[str, Any]) -> None:
    expected = _run(LIGHTNING, options)
    actual = _run(TRAINER, options)
    assert any(
        "train/device/mfu" not in row and "train/device/flops_per_sec" in row for _, row in expected
    )
    assert actual == expected
