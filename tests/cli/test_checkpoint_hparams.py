"""A config run's ``--ckpt_path`` gives the model its saved hyperparameters as data only.

The config parser (jsonargparse) builds a class a ``class_path`` names — also one written
inside a string, which it reads as YAML — and imports the dotted name given as a string to an
argument typed as a callable or a class. A crafted checkpoint must reach none of that.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule
from trainer.checkpoint import write_checkpoint
from trainer.errors import CheckpointError

pytest.importorskip("jsonargparse")

from trainer.cli.trainer_cli import TrainerCLI

BUILT: list[Any] = []  # what `Recorder` saw built
RECORDER = f"{__name__}.Recorder"


class Recorder:
    """A class a crafted checkpoint names: building it is what must not happen."""

    def __init__(self, note: str = "") -> None:
        BUILT.append(note)


class Net(TrainModule):
    def __init__(
        self,
        width: int = 4,
        hidden: Any = None,
        activation: Callable[..., Any] | None = None,
        name: str = "net",
        scale=1.0,  # unannotated, as many modules' arguments are
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def validate_from(tmp_path: Path, hyper_parameters: dict[str, Any]) -> TrainerCLI:
    checkpoint = write_checkpoint(
        tmp_path / "ck",
        {
            "state_dict": Net().state_dict(),
            "epoch": 0,
            "global_step": 1,
            "hyper_parameters": hyper_parameters,
        },
    )
    options = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    options += ["--trainer.default_root_dir", str(tmp_path)]  # its config.yaml goes there
    return TrainerCLI(
        Net,
        args=["validate", "--ckpt_path", str(checkpoint), *options],
        exit_on_error=False,
    )


@pytest.mark.parametrize(
    ("hyper_parameters", "field"),
    [
        ({"hidden": f'{{"class_path": "{RECORDER}"}}'}, "['hidden'] is a string naming"),
        ({"hidden": f"class_path: {RECORDER}"}, "['hidden'] is a string naming"),
        ({"hidden": [f'{{"class_path": "{RECORDER}"}}']}, "['hidden'][0] is a string"),
        ({"hidden": {"x": {"class_path": RECORDER}}}, "['hidden']['x']['class"),
    ],
)
def test_a_class_path_inside_a_saved_string_is_refused_before_the_parser_builds_it(
    tmp_path: Path, hyper_parameters: dict[str, Any], field: str
) -> None:
    BUILT.clear()
    with pytest.raises(CheckpointError, match="taken as data only") as caught:
        validate_from(tmp_path, {"width": 4, **hyper_parameters})
    assert f"hyper_parameters{field}" in str(caught.value)
    assert BUILT == []


def test_a_dotted_name_for_a_callable_argument_is_refused_before_it_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "payload_on_import.py"
    marker = tmp_path / "imported"
    module.write_text(f"open({str(marker)!r}, 'w').close()\ndef act(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CheckpointError, match="activation.*import the dotted name"):
        validate_from(tmp_path, {"width": 4, "activation": "payload_on_import.act"})
    assert not marker.exists() and "payload_on_import" not in sys.modules


def test_plain_values_are_still_given_to_the_model(tmp_path: Path) -> None:
    saved = {"width": 4, "hidden": "wide", "name": "a.b.c", "scale": 2.5, "activation": None}
    cli = validate_from(tmp_path, saved)
    assert {key: cli.model.hparams[key] for key in saved} == saved
