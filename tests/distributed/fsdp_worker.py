"""FSDP2 checks inside a real 2-process job (torchrun, gloo on CPU); rank facts to OUT/rank<r>.json."""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

import trainer
from tests.distributed.ddp_worker import regression
from tests.distributed.launch import flip_byte
from trainer.strategies import FSDPStrategy


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Net(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def quiet(strategy, **kwargs) -> trainer.Trainer:
    options = dict(
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    options.update(kwargs)
    return trainer.Trainer(strategy=strategy, **options)


def full_weights(fit: trainer.Trainer, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in fit.accelerator.get_state_dict(module).items()}


def fsdp(**kwargs) -> FSDPStrategy:
    return FSDPStrategy("cpu", auto_wrap_policy={"Block"}, **kwargs)


def loader() -> DataLoader:
    return DataLoader(regression(64), batch_size=4, shuffle=True)


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    facts: dict[str, object] = {}

    torch.manual_seed(0)
    ddp_module = Net()
    ddp_fit = quiet("ddp", max_epochs=2, seed=0)
    ddp_fit.fit(ddp_module, loader())
    ddp_weights = {k: v.detach().clone() for k, v in ddp_module.state_dict().items()}

    torch.manual_seed(0)
    module = Net()
    fit = quiet(fsdp(), max_epochs=2, seed=0)
    fit.fit(module, loader())
    weights = full_weights(fit, module)
    facts["fsdp_vs_ddp_max_diff"] = (
        max(float((weights[k] - ddp_weights[k]).abs().max()) for k in ddp_weights)
        if rank == 0
        else 0.0
    )
    facts["distributed_type"] = str(fit.accelerator.distributed_type)
    from torch.distributed.fsdp import FSDPModule

    facts["sharded_modules"] = sorted(
        name for name, sub in module.named_modules() if isinstance(sub, FSDPModule)
    )
    facts["param_is_dtensor"] = type(module.inp.weight).__name__
    # Predict on 9 samples: every forward gathers the shards, so both ranks run 3 batches (the
    # last round padded); without padding rank 0's last forward waited for a rank that had left.
    predicted = fit.predict(module, DataLoader(regression(9), batch_size=2))
    facts["predicted_batches"] = [len(batch) for batch in predicted]
    if rank == 0:
        save_file(
            {k: v.contiguous() for k, v in weights.items()}, os.path.join(out, "fsdp.safetensors")
        )

    # Sharded checkpoint mid-epoch, resumed: equal to the uninterrupted FSDP run.
    torch.manual_seed(0)
    first = Net()
    part = quiet(fsdp(), max_epochs=2, max_steps=5, seed=0)
    part.fit(first, loader())
    part.save_checkpoint(os.path.join(out, "sharded"))
    torch.manual_seed(3)
    resumed = Net()
    again = quiet(fsdp(), max_epochs=2, seed=0)
    again.fit(resumed, loader(), ckpt_path=os.path.join(out, "sharded"))
    resumed_weights = full_weights(again, resumed)
    facts["sharded_resume_equal"] = (
        all(torch.equal(resumed_weights[k], weights[k]) for k in weights) if rank == 0 else True
    )

    # FULL state dict type: rank 0 writes safetensors with the gathered weights.
    torch.manual_seed(0)
    full_module = Net()
    full_fit = quiet(fsdp(state_dict_type="FULL"), max_steps=3, seed=0)
    full_fit.fit(full_module, loader())
    full_fit.save_checkpoint(os.path.join(out, "full"))

    # CPU-RAM-efficient loading: other ranks build on meta and receive rank 0's weights.
    strategy = FSDPStrategy("cpu", cpu_ram_efficient_loading=True)
    accelerator = trainer.Accelerator(strategy=strategy)
    torch.manual_seed(100 + rank)  # rank 0's weights differ from rank 1's before loading
    with strategy.module_init_context():
        built = Net()
    facts["built_on_meta"] = built.inp.weight.device.type
    prepared = accelerator.prepare(built)
    gathered = accelerator.get_state_dict(prepared)
    torch.manual_seed(100)
    rank0_init = Net().state_dict()
    facts["ram_efficient_equal_rank0"] = (
        all(torch.equal(gathered[k], rank0_init[k]) for k in rank0_init) if rank == 0 else True
    )
    local = prepared.inp.weight.to_local()
    expected_local = rank0_init["inp.weight"].chunk(2)[rank]
    facts["ram_efficient_local_shard_equal"] = bool(torch.equal(local, expected_local))

    facts.update(tampered_shards_are_refused_on_every_rank(strategy, out, rank))

    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


def tampered_shards_are_refused_on_every_rank(strategy, out: str, rank: int) -> dict:
    """Each rank hashes only its share of the shards on load; a flipped byte in any shard is
    still refused on both ranks, naming the file, before fit restores anything
    (trainer.checkpoint.rank_hashing). The untampered copy resumes as "sharded" did above."""
    from trainer.checkpoint.manifest import read_manifest
    from trainer.checkpoint.rank_hashing import verified_share

    source = os.path.join(out, "sharded")
    copy = os.path.join(out, "tampered")
    if rank == 0:
        shutil.copytree(source, copy)
    strategy.barrier()
    files = read_manifest(copy)["files"]
    shards = sorted(n for n in files if n.startswith("dcp/"))
    facts: dict[str, object] = {
        "shards": shards,
        "my_share": sorted(set(shards) - verified_share(strategy, files, "dcp")),
    }
    refusals = {}
    for name in shards:
        path = os.path.join(copy, name)
        if rank == 0:
            flip_byte(path, os.path.getsize(path) // 2)
        strategy.barrier()
        try:
            quiet(fsdp(), max_epochs=2, seed=0).fit(Net(), loader(), ckpt_path=copy)
            refusals[name] = None
        except trainer.CheckpointError as err:
            refusals[name] = str(err)
        strategy.barrier()
        if rank == 0:
            flip_byte(path, os.path.getsize(path) // 2)  # flipped back: the next shard's turn
        strategy.barrier()
    facts["refusals"] = refusals
    return facts


if __name__ == "__main__":
    main(sys.argv[1])
