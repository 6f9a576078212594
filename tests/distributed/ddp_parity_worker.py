"""One DDP script run on Lightning 2.6 and on trainer (``torchrun --nproc_per_node 2``, gloo):
what each process read, logged and ended with, written to ``OUT/<framework><rank>.json``.

Usage: ``torchrun --standalone --nproc_per_node 2 ddp_parity_worker.py lightning|trainer OUT
automatic|manual`` (the optimization the module uses).
The loaders carry their own ``DistributedSampler`` with ``use_distributed_sampler=False``, so
both frameworks read the same samples on each process (how each shards a plain loader differs
and is documented in docs/migration/lightning.md); test_ddp_parity.py compares the files.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Indexed(Dataset):
    """Regression samples that also give their index, so a test sees who read what."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def loader(n: int, seed: int, batch_size: int, shuffle: bool = False) -> DataLoader:
    data = Indexed(n, seed)
    rank = int(os.environ["RANK"])
    sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=shuffle, seed=3)
    return DataLoader(data, batch_size=batch_size, sampler=sampler)


def main(framework: str, out: str, optimization: str) -> None:
    warnings.simplefilter("ignore")
    if framework == "lightning":
        import lightning.pytorch as pl

        Base, Trainer, seed_everything = pl.LightningModule, pl.Trainer, pl.seed_everything
        callbacks = pl.callbacks
    else:
        import trainer

        Base, Trainer, seed_everything = (
            trainer.TrainModule,
            trainer.Trainer,
            trainer.seed_everything,
        )
        callbacks = trainer.callbacks
    seen: dict[str, list] = {"train": [], "val": [], "test": [], "val_epoch_end": []}

    class Module(Base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)
            self.automatic_optimization = optimization == "automatic"

        def loss(self, batch, stage: str):
            x, y, index = batch
            seen[stage].append(index.tolist())
            return torch.nn.functional.mse_loss(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch, "train")
            if not self.automatic_optimization:  # two batches per step, clipped
                self.manual_backward(loss / 2)
                if batch_idx % 2 == 1:
                    optimizer = self.optimizers()
                    self.clip_gradients(optimizer, gradient_clip_val=0.2)
                    optimizer.step()
                    optimizer.zero_grad()
                    self.lr_schedulers().step()
            self.log("loss_sync", loss, on_step=True, on_epoch=True, sync_dist=True)
            self.log("loss_local", loss, on_step=True, on_epoch=True)
            self.log(
                "rank", float(self.global_rank), on_epoch=True, sync_dist=True, reduce_fx="max"
            )
            return loss

        def validation_step(self, batch, batch_idx):
            loss = self.loss(batch, "val")
            self.log("val_loss", loss, sync_dist=True)
            self.log("val_local", loss)

        def on_validation_epoch_end(self):  # this validation's synced value, on each rank
            seen["val_epoch_end"].append(round(float(self.trainer.callback_metrics["val_loss"]), 5))

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch, "test"), sync_dist=True)

        def predict_step(self, batch, batch_idx):
            return batch[2]

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)]

    seed_everything(7)
    checkpoint = callbacks.ModelCheckpoint(monitor="val_loss", save_top_k=2)
    stopping = callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.2)

    class Kept(callbacks.Callback):
        """The checkpoints on disk at the end of fit, once every process is there (process 0
        rotates them)."""

        def on_fit_end(self, trainer, module):
            trainer.strategy.barrier()
            names = os.listdir(checkpoint.dirpath)
            self.names = sorted(name.removesuffix(".ckpt") for name in names)

    kept = Kept()
    run = Trainer(
        max_epochs=4, accelerator="cpu", devices=2, strategy="ddp", use_distributed_sampler=False,
        default_root_dir=os.path.join(out, framework), enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=1, num_sanity_val_steps=1,
        callbacks=[checkpoint, stopping, kept],
    )  # fmt: skip
    module = Module()
    run.fit(module, loader(22, 0, 3, shuffle=True), loader(11, 1, 2))
    result = {
        "best": [
            os.path.basename(checkpoint.best_model_path).removesuffix(".ckpt"),
            round(float(checkpoint.best_model_score), 5),
        ],
        "kept": kept.names,
        "stopped_epoch": stopping.stopped_epoch,
        "callback_metrics": {
            k: round(float(v), 5) for k, v in sorted(run.callback_metrics.items())
        },
        "global_step": run.global_step,
        "weights": [round(v, 5) for v in module.net.weight.flatten().tolist()],
        "test": run.test(module, loader(9, 2, 2), verbose=False),
        "predicted": [p.tolist() for p in run.predict(module, loader(9, 2, 2))],
        "seen": seen,
    }
    with open(os.path.join(out, f"{framework}{run.global_rank}.json"), "w") as file:
        json.dump(result, file)
    if torch.distributed.is_initialized():  # Lightning leaves it; ending it makes the exit clean
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
