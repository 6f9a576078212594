"""Parity by difference: the results table ``validate(verbose=True)`` / ``test(verbose=True)``
print, on lightning.pytorch 2.6 and on trainer.

Each scenario captures what each framework writes to stdout and compares the table's cells, row
by row (headers, metric names without ``/dataloader_idx_N``, values as Python prints them, a
blank where a dataloader did not log the metric), not the box-drawing characters. With
``verbose=False``, and for the validation inside ``fit``, nothing is printed. Lightning's output
is the expected value.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.parity.frameworks import LIGHTNING, TRAINER, loader, quiet
from tests.parity.frameworks import regression as regression_class

_BORDER = re.compile(r"^[\s━─┏┓┗┛┡┩┳┻╇┃│└┘┌┐├┤┼╭╮╰╯-]*$")


def _module(fw: Any) -> Any:
    class Logging(regression_class(fw.Module)):  # type: ignore[misc]
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            loss = self.loss(batch)
            self.log("val_loss", loss)
            self.log("val_both", loss, on_step=True, on_epoch=True)

        def on_validation_epoch_end(self):
            self.log("val_epoch_end", 2.5)

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("test_loss", self.loss(batch))
            if dataloader_idx == 1:
                self.log("only_on_one", float(batch_idx), add_dataloader_idx=True)
            if dataloader_idx == 0:
                self.log("a_rather_long_metric_name_over_25", 1.0, add_dataloader_idx=False)

    return Logging()


def _cells(text: str) -> list[list[str]]:
    """The table's rows as lists of cell texts (rich's table), border lines left out."""
    rows = []
    for line in text.splitlines():
        if not line.strip() or _BORDER.match(line):
            continue
        rows.append([cell.strip() for cell in re.split(r"[┃│]", line)[1:-1]])  # blanks kept
    return rows


def _printed(fw: Any, capsys: pytest.CaptureFixture[str], stage: str, **call: Any) -> Any:
    fit = fw.trainer(**quiet(max_epochs=1, limit_train_batches=2))
    module = _module(fw)
    fit.fit(module, loader(4), loader(4, seed=1))
    capsys.readouterr()  # fit prints no table
    loaders = {"one": loader(4, seed=1), "two": [loader(4, seed=1), loader(6, seed=2)]}
    five = [loader(2, seed=seed) for seed in range(5)]  # more columns than one table holds
    data = {**loaders, "five": five}[call.pop("loaders")]
    getattr(fit, stage)(module, data, **call)
    return _cells(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("stage", "loaders"),
    [("validate", "one"), ("validate", "two"), ("test", "two"), ("test", "five")],
)
def test_verbose_prints_lightnings_table(
    capsys: pytest.CaptureFixture[str], stage: str, loaders: str
) -> None:
    expected = _printed(LIGHTNING, capsys, stage, loaders=loaders, verbose=True)
    assert expected and expected[0][0] == f"{stage.capitalize()} metric"
    assert _printed(TRAINER, capsys, stage, loaders=loaders, verbose=True) == expected


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_not_verbose_prints_nothing(capsys: pytest.CaptureFixture[str], stage: str) -> None:
    assert _printed(LIGHTNING, capsys, stage, loaders="two", verbose=False) == []
    assert _printed(TRAINER, capsys, stage, loaders="two", verbose=False) == []


def test_without_rich_both_print_the_same_plain_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's fallback when rich is not installed: centred columns between rules."""
    from lightning.pytorch.loops import evaluation_loop

    from trainer.trainer import results_table

    monkeypatch.setattr(evaluation_loop, "_RICH_AVAILABLE", False)
    monkeypatch.setattr(results_table, "is_available", lambda name: name != "rich")
    printed = {}
    for fw in (LIGHTNING, TRAINER):
        fit = fw.trainer(**quiet())
        fit.test(_module(fw), [loader(4, seed=1), loader(6, seed=2)], verbose=True)
        printed[fw.name] = capsys.readouterr().out
    assert "Test metric" in printed["lightning"]
    assert printed["trainer"] == printed["lightning"]
