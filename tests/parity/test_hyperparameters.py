"""Parity by difference: ``save_hyperparameters`` and the hyperparameters the loggers and
checkpoints get, on lightning.pytorch 2.6 and trainer.

The ways Lightning projects call it: a subclass chain (``super().__init__`` adds the subclass's
arguments), one ``dict`` or ``argparse.Namespace`` config argument, names, ``ignore`` dropping
what a base class recorded, two calls, ``logger=False``, a helper method that calls it from
``__init__``; ``Trainer(enable_autolog_hparams=False)``; hyperparameters logged by ``validate``
too; and ``load_from_checkpoint`` of a module built from a dict config. Compared: ``hparams``,
``hparams_initial`` and the CSV logger's ``hparams.yaml`` (parsed: Lightning sorts its keys, we
keep the recorded order), and the module ``load_from_checkpoint`` rebuilds.
Lightning's run is the expected value.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.parity.frameworks import BOTH, Framework, loader, quiet

pytestmark = pytest.mark.filterwarnings("ignore")


def _classes(base: type) -> dict[str, type]:
    class Plain(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Regressor(Plain):
        def __init__(self, lr: float = 0.1, depth: int = 1) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Wider(Regressor):
        def __init__(self, width: int = 3, lr: float = 0.2, **extra: Any) -> None:
            super().__init__(lr=lr)
            self.extra = extra

    class Dropping(Regressor):
        def __init__(self, lr: float = 0.3, depth: int = 2, seed: int = 7) -> None:
            super().__init__(lr=lr, depth=depth)
            self.save_hyperparameters(ignore=["depth", "seed"])

    class Configured(Plain):
        def __init__(self, config: Any, backbone: str = "mlp") -> None:
            super().__init__()
            self.save_hyperparameters(config)

    class Named(Regressor):
        def __init__(self, lr: float = 0.4, depth: int = 3, name: str = "n") -> None:
            super().__init__(lr=lr)
            self.save_hyperparameters("name", "depth")

    class NotLogged(Regressor):
        def __init__(self, lr: float = 0.5) -> None:
            super().__init__(lr=lr)
            self.save_hyperparameters(logger=False)

    class Helper(Regressor):
        def __init__(self, lr: float = 0.6, width: int = 4) -> None:
            super().__init__(lr=lr)
            self._record()

        def _record(self) -> None:
            self.save_hyperparameters()

    return {cls.__name__: cls for cls in (Wider, Dropping, Configured, Named, NotLogged, Helper)}


def _build(framework: Framework, case: str) -> Any:
    classes = _classes(framework.Module)
    if case == "dict config":
        return classes["Configured"]({"lr": 0.5, "layers": [8, 4]}, backbone="cnn")
    if case == "Namespace config":
        return classes["Configured"](argparse.Namespace(lr=0.5, layers=[8, 4]))
    if case == "subclass with **extra":
        return classes["Wider"](width=5, dropout=0.1)
    name = case.split()[0]
    return classes[name]()


CASES = [
    "subclass with **extra",
    "Dropping ignored",
    "dict config",
    "Namespace config",
    "Named arguments",
    "NotLogged",
    "Helper method",
]


def _logged(root: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) or {} for path in sorted(root.rglob("hparams.yaml"))]


def _fit(framework: Framework, root: Path, case: str, stage: str = "fit", **options: Any) -> dict:
    module = _build(framework, case)
    run = framework.trainer(
        **quiet(max_epochs=1, default_root_dir=root, logger=framework.loggers.CSVLogger(root)),
        **options,
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if stage == "fit":
        run.fit(module, loader(8))
    else:
        run.validate(module, loader(4), **framework.eval_options)
    return {
        "hparams": dict(module.hparams),
        "initial": dict(module.hparams_initial),
        "logged": _logged(root),
    }


@pytest.mark.parametrize("case", CASES)
def test_recorded_and_logged_hyperparameters_equal_lightnings(tmp_path, case):
    lightning, ours = (_fit(fw, tmp_path / fw.name, case) for fw in BOTH)
    assert ours == lightning


@pytest.mark.parametrize(
    ("stage", "options"),
    [("validate", {}), ("fit", {"enable_autolog_hparams": False})],
    ids=["validate logs them too", "enable_autolog_hparams=False"],
)
def test_when_hyperparameters_reach_the_loggers_equals_lightning(tmp_path, stage, options):
    lightning, ours = (
        _fit(fw, tmp_path / fw.name, "Named arguments", stage, **options) for fw in BOTH
    )
    assert ours["logged"] == lightning["logged"]
    assert ours["logged"] == ([{"depth": 3, "lr": 0.4, "name": "n"}] if not options else [])


def test_load_from_checkpoint_passes_a_dict_config_back_by_its_argument(tmp_path):
    def reload(framework: Framework) -> tuple[dict[str, Any], str, Any]:
        root = tmp_path / framework.name
        module = _build(framework, "dict config")
        run = framework.trainer(**quiet(max_epochs=1, default_root_dir=root))
        run.fit(module, loader(8))
        path = root / "model.ckpt"
        run.save_checkpoint(path)
        cls = type(module)
        loaded = cls.load_from_checkpoint(path)
        overridden = cls.load_from_checkpoint(path, backbone="vit")
        return dict(loaded.hparams), overridden.hparams["lr"], dict(loaded.net.state_dict())

    (l_hparams, l_lr, l_weights), (t_hparams, t_lr, t_weights) = (reload(fw) for fw in BOTH)
    assert t_hparams == l_hparams == {"lr": 0.5, "layers": [8, 4]}
    assert t_lr == l_lr == 0.5
    for key, value in l_weights.items():
        torch.testing.assert_close(t_weights[key], value)


def test_a_lightning_checkpoint_whose_config_has_no_argument_name_loads(tmp_path):
    """Lightning writes ``hparams_name: None`` for a dict that is not an ``__init__`` argument."""
    lightning, ours = BOTH

    def literal(base: type) -> type:
        class Literal(_classes(base)["Configured"].__mro__[1]):  # Plain
            def __init__(self) -> None:
                super().__init__()
                self.save_hyperparameters({"lr": 0.25, "layers": [2]})

        return Literal

    module = literal(lightning.Module)()
    run = lightning.trainer(**quiet(max_epochs=1, default_root_dir=tmp_path))
    run.fit(module, loader(8))
    path = tmp_path / "lightning.ckpt"
    run.save_checkpoint(path)
    assert torch.load(path, weights_only=False)["hparams_name"] is None
    loaded = literal(ours.Module).load_from_checkpoint(path)
    assert dict(loaded.hparams) == {"lr": 0.25, "layers": [2]}
    torch.testing.assert_close(loaded.net.weight, module.net.weight)
