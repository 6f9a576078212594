"""Count the framework files one training step runs code in, and the entries into the Trainer's file.

The step: the second epoch of a fit with one batch per epoch, ``self.log`` in training_step, the
CSV logger and a ModelCheckpoint saving at the epoch's end — from ``on_train_epoch_start`` to
``on_train_end``. An "entry" into a file is a call whose caller is in another file (a return trip
into it counts again). Used for issue #16's before/after figures (docs/layout.md).

Usage: python scripts/trace_step.py
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer import Trainer, TrainModule
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.loggers import CSVLogger

PACKAGE = Path(trainer.__file__).resolve().parent
TRAINER_FILES = ("trainer/trainer.py", "trainer/trainer/trainer.py")  # before / after the layout


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Tracer(Callback):
    def __init__(self) -> None:
        self.files: Counter[str] = Counter()
        self.entries: Counter[str] = Counter()

    def _profile(self, frame, event, arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename).resolve()
        if PACKAGE not in path.parents:
            return
        name = str(path.relative_to(PACKAGE.parent))
        self.files[name] += 1
        caller = frame.f_back
        if caller is None or Path(caller.f_code.co_filename).resolve() != path:
            self.entries[name] += 1

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            sys.setprofile(self._profile)

    def on_train_end(self, trainer, module):
        sys.setprofile(None)


def main() -> None:
    data = TensorDataset(torch.randn(4, 4), torch.randn(4, 1))
    tracer = Tracer()
    with tempfile.TemporaryDirectory() as root:
        fit = Trainer(
            max_epochs=2,
            limit_train_batches=1,
            logger=CSVLogger(root),
            callbacks=[tracer, ModelCheckpoint(dirpath=root, every_n_epochs=1, save_last=True)],
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
            default_root_dir=root,
        )
        fit.fit(Net(), DataLoader(data, batch_size=4))
    trainer_file = next((f for f in TRAINER_FILES if f in tracer.files), "?")
    print(f"files run: {len(tracer.files)}")
    print(f"entries into {trainer_file}: {tracer.entries[trainer_file]}")
    for name, count in sorted(tracer.entries.items()):
        print(f"  {name}: {count} entries, {tracer.files[name]} calls")


if __name__ == "__main__":
    main()
