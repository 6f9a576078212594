"""Lightning's Strategy API and ``rank_zero_only.rank`` on 2 processes (torchrun, gloo), run by
Lightning 2.6 and by trainer; and ``sync_dist=True`` logged on one rank only, run by trainer.

Usage: ``torchrun --standalone --nproc_per_node 2 strategy_api_worker.py FRAMEWORK OUT SCENARIO``

- ``api`` (``lightning`` or ``trainer``): inside ``fit`` each process calls the strategy's
  ``reduce`` / ``barrier`` / ``broadcast`` / ``all_gather`` with Lightning's arguments and reads
  ``rank_zero_only.rank`` (at import, and after a stale value was assigned before ``fit``);
  trainer's also builds an ``Accelerator`` after such an assignment. Each process writes what it
  saw to ``OUT/<framework><rank>.json``; test_strategy_lightning_api.py compares the two.
  ``LightningModule.all_gather`` of Python numbers, and the strategy's ``num_nodes`` /
  ``num_processes`` / ``parallel_devices`` / ``process_group_backend`` are compared too.
- ``training_step`` / ``on_validation_epoch_end`` (trainer): rank 1 logs a ``sync_dist=True``
  epoch value in that hook, rank 0 logs none. Each process writes the error its ``fit`` raised
  to ``OUT/trainer<rank>.json`` (the test's timeout catches a hang).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


def _frameworks(framework: str):
    """(TrainModule base, Trainer, rank_zero_only) of ``framework``."""
    if framework == "lightning":
        import lightning.pytorch as pl
        from lightning.pytorch.utilities import rank_zero_only

        return pl.LightningModule, pl.Trainer, rank_zero_only
    import trainer
    from trainer.utilities import rank_zero_only

    return trainer.TrainModule, trainer.Trainer, rank_zero_only


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


def _strategy_calls(strategy, rank: int) -> dict:
    """Lightning's Strategy verbs with Lightning's arguments, as a user's hook calls them."""

    def fresh() -> torch.Tensor:  # Lightning's reduce writes the result into its input
        return torch.tensor([float(rank + 1)])  # 1. on rank 0, 2. on rank 1

    x = fresh()
    facts: dict = {}
    ops = ["mean", "avg", "AVG", "sum", "SUM", "max", "min"]
    facts["reduce"] = {op: strategy.reduce(fresh(), reduce_op=op).tolist() for op in ops}
    facts["reduce_default"] = strategy.reduce(fresh()).tolist()
    facts["reduce_positional"] = strategy.reduce(fresh(), None, "sum").tolist()
    facts["reduce_torch_ops"] = [
        strategy.reduce(fresh(), reduce_op=op).tolist()
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX)
    ]
    integer = strategy.reduce(torch.tensor([rank + 1]), reduce_op="sum")
    facts["reduce_int_sum"] = [integer.tolist(), str(integer.dtype)]
    facts["reduce_group"] = [
        strategy.reduce(fresh(), group=dist.group.WORLD, reduce_op=op).tolist()
        for op in ("sum", "mean")
    ]
    facts["reduce_not_a_tensor"] = [
        strategy.reduce(3.5),
        strategy.reduce("text", reduce_op="sum"),
        strategy.reduce({"a": rank}),
    ]
    strategy.barrier("before_broadcast")
    strategy.barrier(name="named")
    strategy.barrier()
    facts["broadcast"] = [
        strategy.broadcast({"from": rank}, src=1),
        strategy.broadcast(f"rank{rank}"),
        strategy.broadcast(x, 1).tolist(),
    ]
    gathered = strategy.all_gather(x, group=None, sync_grads=False)
    facts["all_gather"] = [gathered.tolist(), gathered.requires_grad]
    facts["all_gather_group"] = strategy.all_gather(x, dist.group.WORLD).tolist()
    leaf = torch.tensor([float(rank + 1)], requires_grad=True)
    facts["all_gather_no_grad"] = strategy.all_gather(leaf).requires_grad
    differentiable = strategy.all_gather(leaf, sync_grads=True)
    (differentiable.sum() * (rank + 1)).backward()  # d/d(leaf on any rank) = 1 + 2
    facts["all_gather_sync_grads"] = [differentiable.detach().tolist(), leaf.grad.tolist()]
    return facts


def api(framework: str, out: str) -> None:
    Base, Trainer, rank_zero_only = _frameworks(framework)
    rank = int(os.environ["RANK"])
    facts: dict = {"rank_at_import": [rank_zero_only.rank, type(rank_zero_only.rank).__name__]}

    class Module(Base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_train_start(self) -> None:
            facts["rank_in_fit"] = rank_zero_only.rank
            facts["rank_zero_only_ran"] = rank_zero_only(lambda: "ran")()
            facts.update(_strategy_calls(self.trainer.strategy, self.global_rank))
            strategy = self.trainer.strategy
            facts["strategy_facts"] = [
                strategy.num_nodes, strategy.num_processes,
                [str(device) for device in strategy.parallel_devices],
                strategy.process_group_backend,
            ]  # fmt: skip
            gathered = self.all_gather({"n": float(self.global_rank) + 0.5, "k": [3, True]})
            facts["module_all_gather_numbers"] = [
                [value.tolist(), str(value.dtype)] for value in (gathered["n"], *gathered["k"])
            ]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    rank_zero_only.rank = 1 - rank  # stale (the other rank's): the strategy sets it again
    run = Trainer(
        max_epochs=1, limit_train_batches=1, accelerator="cpu", devices=2, strategy="ddp",
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        logger=False, num_sanity_val_steps=0, default_root_dir=os.path.join(out, framework),
    )  # fmt: skip
    run.fit(Module(), _loader())
    if framework == "trainer":  # the Accelerator's own process setup sets it too
        from trainer import Accelerator

        rank_zero_only.rank = 1 - rank
        accelerator = Accelerator(cpu=True)
        facts["rank_after_accelerator"] = rank_zero_only.rank
        accelerator.end_training()
    with open(os.path.join(out, f"{framework}{rank}.json"), "w") as file:
        json.dump(facts, file)
    if dist.is_initialized():  # Lightning leaves it; ending it makes the exit clean
        dist.destroy_process_group()


def one_rank_logs_synced(out: str, hook: str) -> None:
    """Rank 1 logs ``sync_dist=True`` in ``hook``; rank 0 does not: ``fit`` must raise on both."""
    from trainer import ConfigurationError

    Base, Trainer, _ = _frameworks("trainer")
    rank = int(os.environ["RANK"])

    class Module(Base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def loss(self, batch) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            if hook == "training_step" and self.global_rank == 1:
                self.log("only_rank1", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch))  # not synced: rank 0 has no synced name

        def on_validation_epoch_end(self) -> None:
            if hook == "on_validation_epoch_end" and self.global_rank == 1:
                self.log("val_only_rank1", 1.0, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    run = Trainer(
        max_epochs=2, limit_train_batches=2, limit_val_batches=2, accelerator="cpu", devices=2,
        strategy="ddp", enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, logger=False, num_sanity_val_steps=0,
        default_root_dir=os.path.join(out, "trainer"),
    )  # fmt: skip
    error: dict = {"type": None, "message": None}
    try:
        run.fit(Module(), _loader(), _loader())
    except ConfigurationError as err:
        error = {"type": type(err).__name__, "message": str(err)}
    with open(os.path.join(out, f"trainer{rank}.json"), "w") as file:
        json.dump(error, file)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    framework, out, scenario = sys.argv[1:4]
    if scenario == "api":
        api(framework, out)
    else:
        one_rank_logs_synced(out, scenario)
