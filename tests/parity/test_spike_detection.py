"""Parity by difference: ``SpikeDetection`` in Lightning's modes ("min" / "max"), on
lightning.pytorch 2.6 and on trainer.

Each scenario's module returns a loss of about 1.0, set per batch where the scenario wants a
spike, a drop or a NaN, so the loss sequence is known; both fits run with the same detector arguments. Compared: the batch
and step at which the fit stopped with a spike (or that it did not), the batches written to the
exclude file (``skip_batches.json``), and the weights. Lightning's run is the expected value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet

pl = pytest.importorskip("lightning.pytorch")


def _module(fw: Any, factors: dict[tuple[int, int], float], seen: list[Any]) -> Any:
    class Scaled(fw.Module):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            seen.append((self.current_epoch, batch_idx))
            # about 1.0 each batch (the regression's own loss varies too much to pin spikes)
            level = factors.get((self.current_epoch, batch_idx), 1.0)
            return torch.nn.functional.mse_loss(self.net(x), y) * 1e-3 + level

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Scaled()


def _run(fw: Any, root: Path, factors: dict[tuple[int, int], float], **arguments: Any) -> Any:
    seen: list[Any] = []
    module = _module(fw, factors, seen)
    detector = fw.callbacks.SpikeDetection(**arguments)
    fit = fw.trainer(**quiet(max_epochs=3, default_root_dir=str(root), callbacks=[detector]))
    try:
        fit.fit(module, loader(16, batch_size=2))
        stopped = None
    except Exception as error:  # Lightning's TrainingSpikeException, trainer's LossSpikeError
        stopped = "spike" if "spike" in type(error).__name__.lower() else repr(error)
    files = sorted(root.rglob("*.json"))
    written = [json.loads(path.read_text()) for path in files]
    weights = [f"{float(v):.5f}" for v in module.net.weight.flatten()]  # nan == nan as text
    return stopped, seen[-1], [p.name for p in files], written, weights


@pytest.mark.parametrize(
    ("factors", "arguments"),
    [
        ({(0, 5): 40.0}, {"mode": "min"}),  # a spike in epoch 0
        ({(1, 0): 40.0, (1, 3): 40.0}, {"mode": "min", "window": 3}),  # at 1.0 warmup skips it
        ({(0, 4): 0.01}, {"mode": "max", "rtol": 0.5}),  # a drop, for a metric to maximize
        ({(0, 3): 1.4}, {"mode": "min", "atol": 0.5, "rtol": None}),  # under atol: none
        ({(0, 3): 2.5}, {"mode": "min", "atol": 0.5, "rtol": None}),
        ({(2, 6): float("nan")}, {"mode": "min"}),
        ({(0, 2): float("nan")}, {"mode": "min", "finite_only": False}),
        ({(0, 5): 1.5}, {"mode": "min"}),  # not a spike: the fit ends normally
    ],
)
def test_lightning_modes_stop_where_lightning_stops(
    tmp_path: Path, factors: dict[tuple[int, int], float], arguments: dict[str, Any]
) -> None:
    expected = _run(LIGHTNING, tmp_path / "lightning", factors, **arguments)
    actual = _run(TRAINER, tmp_path / "trainer", factors, **arguments)
    assert actual == expected


def test_an_exclude_batches_path_folder_gets_skip_batches_json(tmp_path: Path) -> None:
    arguments = {"mode": "min", "exclude_batches_path": None}
    for fw in (LIGHTNING, TRAINER):
        folder = tmp_path / fw.name / "excluded"
        arguments["exclude_batches_path"] = str(folder)
        _run(fw, tmp_path / fw.name / "root", {(0, 5): 40.0}, **arguments)
        assert json.loads((folder / "skip_batches.json").read_text()) == [4, 5]
