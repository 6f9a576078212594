"""The benchmarks' workload written for PyTorch Lightning and Hugging Face Accelerate.

Owns the reference variants that run in the same process and the same rounds as trainer's, so
every ratio in docs/performance.md has its Lightning and Accelerate figure beside it, measured by
the same clocks on the same machine at the same minute. Each runner does the math of
`workload` (same seed, data, SGD), and the overhead benchmark checks that its final parameters
equal the raw loop's. Both packages are in trainer's ``dev`` extra; `is_available` tells a
caller whether to run them. Nothing here is timed or reported.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import warnings
from typing import Any

import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.workload import (
    RunTimes,
    build_loader,
    build_net,
    build_optimizer,
    flat_params,
    read_clocks,
    run_accelerator_loop,
)

__all__ = [
    "is_available",
    "lightning_loggers",
    "run_hf_accelerate",
    "run_lightning",
    "run_lightning_logging",
    "run_lightning_quiet",
]


def is_available(framework: str) -> bool:
    """Whether ``"lightning"`` or ``"accelerate"`` can be imported (without importing it)."""
    return importlib.util.find_spec(framework) is not None


def _quiet() -> None:
    """Silence Lightning's info lines and its advice warnings (they go to stderr, not timed)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning(\.|$)")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")


@functools.cache
def _lightning_classes() -> tuple[type, type, type]:
    """A LightningModule pair (quiet, logging) and a loop timer, built on first use."""
    import lightning.pytorch as pl

    class LitQuiet(pl.LightningModule):
        def __init__(self, lr: float = 0.05, has_hparams: bool = False) -> None:
            super().__init__()
            if has_hparams:
                self.save_hyperparameters("lr")
            self.net = build_net()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return build_optimizer(self.parameters())

    class LitLogging(LitQuiet):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("loss", loss, prog_bar=True)
            return loss

    class LoopTimer(pl.Callback):
        start = end = (0.0, 0.0)

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.start = read_clocks()

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.end = read_clocks()

    return LitQuiet, LitLogging, LoopTimer


def run_lightning(
    dataset: TensorDataset, steps: int, *, is_logging: bool, hparams: bool = False, **options: Any
) -> RunTimes:
    """``lightning.pytorch.Trainer.fit`` for one epoch of ``steps`` steps; ``options`` go to it.

    ``is_logging`` picks the module whose ``training_step`` calls ``self.log("loss", loss,
    prog_bar=True)``; ``hparams`` records its one hyperparameter (``save_hyperparameters``), as
    the loggers benchmark does for trainer.
    """
    import lightning.pytorch as pl

    _quiet()
    quiet, logging_module, timer_class = _lightning_classes()
    module = (logging_module if is_logging else quiet)(has_hparams=hparams)
    loader, timer = build_loader(dataset), timer_class()
    start = read_clocks()
    trainer = pl.Trainer(
        max_epochs=1, max_steps=steps, accelerator="cpu", devices=1, callbacks=[timer], **options
    )
    trainer.fit(module, loader)
    end = read_clocks()
    if trainer.global_step != steps:
        raise RuntimeError(f"Lightning took {trainer.global_step} steps, expected {steps}")
    return RunTimes(start, timer.start, timer.end, end, flat_params(module.net))


def run_lightning_quiet(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    """Lightning with every option off: trainer's ``trainer_quiet``."""
    return run_lightning(
        dataset,
        steps,
        is_logging=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=workdir,
    )


def run_lightning_logging(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    """Lightning's defaults (TQDM bar, model summary, checkpoint at the end) + CSVLogger +
    ``self.log`` every step: trainer's ``trainer_logging``."""
    from lightning.pytorch.loggers import CSVLogger

    return run_lightning(
        dataset,
        steps,
        is_logging=True,
        logger=CSVLogger(workdir),
        log_every_n_steps=50,
        default_root_dir=workdir,
    )


def lightning_loggers(workdir: str, tracking_uri: str) -> list[Any]:
    """Lightning's CSV, TensorBoard, W&B (offline) and MLflow loggers, as the loggers bench uses."""
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

    return [
        CSVLogger(os.path.join(workdir, "csv")),
        TensorBoardLogger(os.path.join(workdir, "tb")),
        WandbLogger(project="bench", save_dir=os.path.join(workdir, "wandb"), offline=True),
        MLFlowLogger(experiment_name="bench", tracking_uri=tracking_uri),
    ]


def run_hf_accelerate(dataset: TensorDataset, steps: int, workdir: str) -> RunTimes:
    """A hand-written loop on Hugging Face ``accelerate.Accelerator(cpu=True)``: trainer's
    ``accelerator`` variant, line for line."""
    from accelerate import Accelerator

    return run_accelerator_loop(Accelerator, dataset)
