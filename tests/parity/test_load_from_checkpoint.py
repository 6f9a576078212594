"""Parity by difference: ``Model.load_from_checkpoint`` / ``DataModule.load_from_checkpoint`` on
lightning.pytorch 2.6 and trainer.

A module trained with ``save_hyperparameters()`` is rebuilt from the checkpoint each framework's
``ModelCheckpoint`` wrote: the hyperparameters it was built with, keyword overrides (and
keywords ``__init__`` does not take, dropped), ``hparams_file``, ``on_load_checkpoint``, the
weights, ``strict`` against a module with an extra layer, an ``__init__`` argument nobody saved,
the call on an instance, and the DataModule's hyperparameters and state. Lightning's run is the
expected value; trainer also loads Lightning's ``.ckpt``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import trainer
from tests.parity.frameworks import BOTH, LIGHTNING, TRAINER, Framework, dataset, loader, quiet

pl = pytest.importorskip("lightning.pytorch")


def _network(base: type) -> type:
    class Network(base):  # type: ignore[misc, valid-type]
        def __init__(self, hidden: int = 3, lr: float = 0.1, note: str = "plain") -> None:
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1))
            self.loaded_keys: list[str] | None = None

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            shared = ("epoch", "global_step", "hyper_parameters", "state_dict")
            self.loaded_keys = sorted(k for k in checkpoint if k in shared)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.body(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Network


def _wider(network: type) -> type:
    class Wider(network):  # type: ignore[misc, valid-type]
        def __init__(self, hidden: int = 3, lr: float = 0.1, note: str = "plain") -> None:
            super().__init__(hidden, lr, note)
            self.head = torch.nn.Linear(1, 1)

    return Wider


def _needs_width(base: type) -> type:
    class NeedsWidth(base):  # type: ignore[misc, valid-type]
        def __init__(self, width: int) -> None:  # no save_hyperparameters
            super().__init__()
            torch.manual_seed(1)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 1))

    return NeedsWidth


def _data_module(framework: Framework) -> type:
    base = pl.LightningDataModule if framework is LIGHTNING else trainer.DataModule

    class Numbers(base):  # type: ignore[misc, valid-type]
        def __init__(self, batch_size: int = 2, size: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.handed_out = 0

        def train_dataloader(self) -> Any:
            self.handed_out += 1
            return torch.utils.data.DataLoader(
                dataset(self.hparams.size), batch_size=self.hparams.batch_size
            )

        def state_dict(self) -> dict[str, Any]:
            return {"handed_out": self.handed_out}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.handed_out = state_dict["handed_out"]

    return Numbers


def _trained(framework: Framework, root: Path, **hparams: Any) -> tuple[Any, str]:
    """A Network built with ``hparams``, fitted 2 epochs; its module and the checkpoint path."""
    module = _network(framework.Module)(**hparams)
    run = framework.trainer(
        **quiet(enable_checkpointing=True, max_epochs=2, default_root_dir=str(root))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(module, loader(16, batch_size=4))
    return module, run.checkpoint_callback.best_model_path


def _weights(module: torch.nn.Module) -> dict[str, list[float]]:
    return {k: v.flatten().tolist() for k, v in module.state_dict().items()}


def _outcome(load: Any, *args: Any, **kwargs: Any) -> Any:
    """What ``load(*args, **kwargs)`` gave: ("raised",) or ("loaded", class, hparams, weights,
    checkpoint keys seen by on_load_checkpoint, training mode)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = load(*args, **kwargs)
    except Exception:
        return ("raised",)
    return (
        "loaded",
        type(module).__name__,
        dict(module.hparams),
        _weights(module),
        getattr(module, "loaded_keys", None),
        module.training,
    )


def test_load_from_checkpoint_as_in_lightning(tmp_path: Path) -> None:
    hparams_file = tmp_path / "hparams.yaml"
    hparams_file.write_text("hidden: 5\nlr: 0.3\n", encoding="utf-8")
    seen: dict[str, dict[str, Any]] = {}
    for framework in BOTH:
        trained, path = _trained(framework, tmp_path / framework.name, hidden=5, lr=0.2)
        network = _network(framework.Module)
        wider, needs_width = _wider(network), _needs_width(framework.Module)
        outcome = {
            "plain": _outcome(network.load_from_checkpoint, path),
            "overrides": _outcome(
                network.load_from_checkpoint, path, lr=0.5, note="tuned", unknown=1
            ),
            "hparams_file": _outcome(network.load_from_checkpoint, path, hparams_file=hparams_file),
            "strict": _outcome(wider.load_from_checkpoint, path),
            "not strict": _outcome(wider.load_from_checkpoint, path, strict=False),
            "shape differs": _outcome(network.load_from_checkpoint, path, hidden=6),
            "argument not saved": _outcome(needs_width.load_from_checkpoint, path),
            "argument given": _outcome(needs_width.load_from_checkpoint, path, width=5),
            "on an instance": _outcome(trained.load_from_checkpoint, path),
        }
        assert outcome["plain"][3] == _weights(trained), framework.name  # the fitted weights
        seen[framework.name] = outcome
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"]["plain"][2] == {"hidden": 5, "lr": 0.2, "note": "plain"}
    assert seen["trainer"]["overrides"][2] == {"hidden": 5, "lr": 0.5, "note": "tuned"}
    assert seen["trainer"]["strict"] == ("raised",)
    assert seen["trainer"]["on an instance"] == ("raised",)


def test_a_lightning_ckpt_loads_into_a_train_module(tmp_path: Path) -> None:
    trained, path = _trained(LIGHTNING, tmp_path, hidden=4, lr=0.3, note="ported")
    assert path.endswith(".ckpt")
    loaded = _network(TRAINER.Module).load_from_checkpoint(path)
    assert dict(loaded.hparams) == {"hidden": 4, "lr": 0.3, "note": "ported"}
    assert _weights(loaded) == _weights(trained)


def test_datamodule_load_from_checkpoint_as_in_lightning(tmp_path: Path) -> None:
    seen = {}
    for framework in BOTH:
        numbers = _data_module(framework)
        datamodule = numbers(batch_size=4, size=12)
        run = framework.trainer(
            **quiet(
                enable_checkpointing=True,
                max_epochs=2,
                default_root_dir=str(tmp_path / framework.name),
                reload_dataloaders_every_n_epochs=1,
            )
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run.fit(_network(framework.Module)(), datamodule=datamodule)
        path = run.checkpoint_callback.best_model_path
        loaded = numbers.load_from_checkpoint(path, size=20)
        seen[framework.name] = (dict(loaded.hparams), loaded.handed_out)
    assert seen["trainer"] == seen["lightning"]
    assert seen["trainer"][0] == {"batch_size": 4, "size": 20}


def test_map_location_and_bad_arguments(tmp_path: Path) -> None:
    from trainer.errors import CheckpointError, ConfigurationError

    _, path = _trained(TRAINER, tmp_path)
    network = _network(TRAINER.Module)
    assert network.load_from_checkpoint(path, map_location=torch.device("cpu")).device.type == "cpu"
    with pytest.raises(ConfigurationError, match="map_location"):
        network.load_from_checkpoint(path, map_location={"cuda:0": "cpu"})
    with pytest.raises(ConfigurationError, match="hparams_file"):
        network.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.csv")
    with pytest.raises(CheckpointError, match="does not exist"):
        network.load_from_checkpoint(tmp_path / "missing")
    with pytest.raises(ConfigurationError, match=r"needs \['width'\].*width=\.\.\."):
        _needs_width(TRAINER.Module).load_from_checkpoint(path)
    with pytest.raises(CheckpointError, match="do not fit Wider"):
        _wider(network).load_from_checkpoint(path)
