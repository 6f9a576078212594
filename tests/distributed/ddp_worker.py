"""Checks that run inside a real 2-process job (``torchrun --nproc_per_node 2``, gloo on CPU).

Usage: ``torchrun --standalone --nproc_per_node 2 ddp_worker.py OUT_DIR``. Each rank writes
``OUT_DIR/rank<r>.json`` with the facts it observed; rank 0 also writes the DDP-trained weights.
The pytest side (test_ddp.py) compares them with a single-process run and with the dataset.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torchmetrics
from safetensors.torch import save_file
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import trainer
from trainer import Accelerator, DataLoaderConfiguration
from trainer.strategies import DDPStrategy


class Net(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True, on_epoch=True)
        if batch_idx == 0 and self.current_epoch == 0:  # Lightning's self.all_gather
            mine = torch.tensor([self.global_rank + 1.0], requires_grad=True)
            gathered = self.all_gather({"mine": mine}, sync_grads=True)["mine"]
            gathered.sum().backward()  # every rank's sum holds `mine` once: its grad is 2
            self.gather_facts = [list(gathered.shape), gathered.flatten().tolist(), mine.grad.tolist()]  # fmt: skip
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)
        self.log("rank_value", float(self.global_rank), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def regression(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))


def quiet(**kwargs) -> trainer.Trainer:
    options = dict(
        strategy="ddp", accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
        logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    options.update(kwargs)
    return trainer.Trainer(**options)


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n, dtype=torch.float32))

    def __len__(self) -> int:
        return self.n


def gathered_samples(loader: DataLoader, config: DataLoaderConfiguration) -> list[int]:
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    prepared = accelerator.prepare(loader)
    seen: list[torch.Tensor] = []
    for batch in prepared:
        values = batch[0] if isinstance(batch, list | tuple) else batch
        seen.append(accelerator.gather_for_metrics(values))
    return [int(v) for v in torch.cat(seen).tolist()] if seen else []


def prepare_data_seen(out: str, rank: int) -> dict[str, object]:
    """A DataModule whose slow prepare_data writes the file its setup reads (the download
    pattern), and a module's prepare_data: who ran them, and what setup found."""
    folder = Path(out) / "prepared"

    class Downloading(trainer.DataModule):
        def prepare_data(self) -> None:
            time.sleep(1.0)  # a download: rank 1 must not read before it ends
            folder.mkdir(exist_ok=True)
            (folder / "data.txt").write_text("64", encoding="utf-8")
            (folder / f"datamodule-by-{self.trainer.global_rank}").touch()

        def setup(self, stage: str) -> None:
            self.size = int((folder / "data.txt").read_text(encoding="utf-8"))

        def val_dataloader(self) -> DataLoader:
            return DataLoader(regression(self.size), batch_size=8)

    class Preparing(Net):
        prepare_data_per_node = False

        def prepare_data(self) -> None:
            (folder / f"module-by-{self.global_rank}").touch()

    datamodule = Downloading()
    quiet().validate(Preparing(), datamodule=datamodule)
    return {"size": datamodule.size, "ran": sorted(p.name for p in folder.glob("*-by-*"))}


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    facts: dict[str, object] = {"world_size": int(os.environ["WORLD_SIZE"])}

    # 1. DDP training: shuffled, 2 epochs, batch 4 per process (global 8); weights for parity.
    torch.manual_seed(0)
    module = Net()
    fit = quiet(max_epochs=2, seed=0)
    fit.fit(
        module,
        DataLoader(regression(), batch_size=4, shuffle=True),
        DataLoader(regression(32), batch_size=4),
    )
    facts["strategy"] = type(fit.strategy).__name__
    facts["distributed_type"] = str(fit.accelerator.distributed_type)
    facts["global_step"] = fit.global_step
    facts["num_training_batches"] = fit.num_training_batches
    facts["rank_value"] = float(fit.callback_metrics["rank_value"])
    facts["val_loss"] = float(fit.callback_metrics["val/loss"])
    facts["module_all_gather"] = module.gather_facts
    facts["machine"] = [fit.num_devices, fit.node_rank, fit.num_nodes]
    if rank == 0:
        save_file(weights(module), os.path.join(out, "ddp.safetensors"))

    # 2. Save, then resume on 2 processes: equal to the uninterrupted run above.
    torch.manual_seed(0)
    first = Net()
    part = quiet(max_epochs=2, max_steps=5, seed=0)
    part.fit(first, DataLoader(regression(), batch_size=4, shuffle=True))
    part.save_checkpoint(os.path.join(out, "ck"))
    torch.manual_seed(7)
    resumed = Net()
    quiet(max_epochs=2, seed=0).fit(
        resumed,
        DataLoader(regression(), batch_size=4, shuffle=True),
        ckpt_path=os.path.join(out, "ck"),
    )
    facts["resume_equal"] = all(
        torch.equal(a, b) for a, b in zip(resumed.parameters(), module.parameters(), strict=True)
    )

    # 3. gather_for_metrics covers exactly the dataset.
    facts["gather_99"] = gathered_samples(
        DataLoader(list(range(99)), batch_size=8), DataLoaderConfiguration()
    )
    facts["gather_512"] = gathered_samples(
        DataLoader(list(range(512)), batch_size=8), DataLoaderConfiguration()
    )
    facts["gather_9_batch5"] = gathered_samples(
        DataLoader(list(range(9)), batch_size=5), DataLoaderConfiguration()
    )
    facts["gather_split_99"] = gathered_samples(
        DataLoader(list(range(99)), batch_size=8), DataLoaderConfiguration(split_batches=True)
    )
    facts["gather_drop_last_99"] = gathered_samples(
        DataLoader(list(range(99)), batch_size=8, drop_last=True), DataLoaderConfiguration()
    )
    facts["gather_iterable_99"] = gathered_samples(
        DataLoader(Stream(99), batch_size=8), DataLoaderConfiguration()
    )
    accelerator = Accelerator(cpu=True)
    shard = accelerator.prepare(DataLoader(list(range(99)), batch_size=8))
    facts["local_first_batch"] = next(iter(shard)).tolist()
    facts["shuffled_first_batch"] = next(
        iter(accelerator.prepare(DataLoader(list(range(99)), batch_size=8, shuffle=True)))
    ).tolist()

    # 4. Collectives.
    facts["gather_scalar"] = accelerator.gather(torch.tensor(float(rank))).tolist()
    facts["reduce_sum"] = accelerator.reduce(torch.tensor([rank + 1.0]), "sum").tolist()
    facts["reduce_mean"] = accelerator.reduce(torch.tensor([rank + 1.0]), "mean").tolist()
    facts["broadcast"] = accelerator.broadcast(torch.tensor([rank + 10])).tolist()
    padded = accelerator.pad_across_processes(torch.ones(rank + 1, 2), dim=0)
    facts["padded_shape"] = list(padded.shape)
    with accelerator.split_between_processes(["a", "b", "c"], apply_padding=True) as piece:
        facts["split"] = piece
    metric = torchmetrics.SumMetric()
    metric.update(torch.tensor(rank + 1.0))
    facts["torchmetrics_sum"] = float(metric.compute())

    # 5. Different metric names on different ranks: a clear error, not a hang.
    class Divergent(Net):
        def validation_step(self, batch, batch_idx):
            self.log(f"only_rank{self.global_rank}", 1.0, sync_dist=True)

    try:
        quiet().validate(Divergent(), DataLoader(regression(16), batch_size=4))
        facts["divergent_error"] = None
    except trainer.ConfigurationError as err:
        facts["divergent_error"] = str(err)

    # 5b. rank_zero_only=True (Lightning's): logged on rank 0 alone, with sync_dist=True, it is
    # not reduced, so the other rank does not wait in a collective that never comes.
    class RankZeroOnly(Net):
        def validation_step(self, batch, batch_idx):
            if self.global_rank == 0:
                self.log("rank0_value", 7.0, sync_dist=True, rank_zero_only=True)

    metrics = quiet().validate(RankZeroOnly(), DataLoader(regression(16), batch_size=4))
    facts["rank_zero_only_metrics"] = metrics

    facts["ddp_kwargs_static_graph"] = DDPStrategy(static_graph=True).ddp_kwargs["static_graph"]

    # 5c. sync_dist=True reduces a step value when it is logged, as Lightning: every rank's
    # callback_metrics show the same step value; the epoch value is reduced at the epoch end.
    class StepSynced(Net):
        def training_step(self, batch, batch_idx):
            self.log("rank_step_mean", float(self.global_rank + 1), sync_dist=True, on_step=True)
            self.log("rank_step_max", float(self.global_rank), sync_dist=True, reduce_fx="max")
            self.log("rank_local", float(self.global_rank), on_step=True)
            return super().training_step(batch, batch_idx)

    stepped = quiet(max_steps=2)
    stepped.fit(StepSynced(), DataLoader(regression(16), batch_size=4))
    facts["step_synced"] = {k: float(v) for k, v in sorted(stepped.callback_metrics.items())}

    # 5d. predict pads no batch (Lightning's unrepeated sampler): 9 samples, each predicted once.
    class Indexing(Net):
        def predict_step(self, batch, batch_idx):
            return batch

    class Recording(trainer.callbacks.BasePredictionWriter):
        def write_on_epoch_end(self, trainer_, module, predictions, batch_indices):
            self.indices = batch_indices

    writer = Recording("epoch")
    predicted = quiet(callbacks=[writer]).predict(
        Indexing(), DataLoader(list(range(9)), batch_size=2)
    )
    facts["predicted"] = [int(v) for batch in predicted for v in batch]
    facts["writer_indices"] = [i for batch in writer.indices[0] for i in batch]

    # 6. prepare_data: once per machine, and no rank reaches setup before it is done.
    facts["prepare_data"] = prepare_data_seen(out, rank)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
    unused_parameters(out, rank)  # last: the failed fit leaves its process group short-timed


def unused_parameters(out: str, rank: int) -> None:
    """A layer the loss never uses: Lightning's strategy name trains; plain DDP fails the second
    step with the Trainer's StrategyError (torch's message named its own constructor)."""

    class Unused(Net):
        def __init__(self) -> None:
            super().__init__()
            self.spare = torch.nn.Linear(4, 1)

    data = DataLoader(regression(32), batch_size=4)
    named = quiet(max_steps=3, strategy="ddp_find_unused_parameters_true")
    named.fit(Unused(), data)
    facts: dict[str, object] = {"named_steps": named.global_step, "error": None}
    try:
        quiet(max_steps=3).fit(Unused(), data)
    except trainer.TrainerError as err:
        facts["error"] = [type(err).__name__, str(err)]
    with open(os.path.join(out, f"rank{rank}_unused.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception:
        traceback.print_exc()
        raise
