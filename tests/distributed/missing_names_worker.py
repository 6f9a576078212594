"""Run by torchrun (2 processes, gloo): Accelerate's names an Accelerate script uses.

Args: output folder. Writes ``rank<N>.json`` with what this process saw: a free collective
called before any Accelerator, the free operations, the decorators, the trigger, the gradient
sync forced after ``no_sync``, ``prepare_data_loader`` without an Accelerator, a ``BatchSampler``
given as the sampler, a state round trip with the loader's own generator, and Accelerate's
``training_check`` (a shuffled 2-process run against the 1-process baseline).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

import trainer
from trainer import Accelerator, DataLoaderConfiguration


def first_collective() -> dict[str, Any]:
    """Before any Accelerator: the free functions join the launcher's process group."""
    rank = torch.tensor([float(trainer.gather(torch.tensor(0.0)).numel())])
    return {"gather_before_accelerator": rank.item()}


def operations(rank: int) -> dict[str, Any]:
    mine = torch.tensor([1.0, 2.0]) + 2 * rank  # rank 0: [1, 2], rank 1: [3, 4]
    nest = {"x": [mine, (mine * 10,)]}
    accelerator = Accelerator()
    ragged = torch.ones(rank + 1, 2)
    objects = [f"from {rank}", rank]
    trainer.broadcast_object_list(objects, from_process=1)
    gathered = trainer.gather(nest)
    try:  # as Accelerate's TypeError: checked on each process before anything is sent
        trainer.gather({"x": mine, "n": rank})
        refuses_other = False
    except TypeError:
        refuses_other = True
    reductions = ("mean", "sum", "max", "min", "none")
    return {
        "broadcast": trainer.broadcast(mine.clone(), from_process=1).tolist(),
        "gather_nest": [gathered["x"][0].tolist(), gathered["x"][1][0].tolist()],
        "gather_refuses_other": refuses_other,
        "gather_object_list": trainer.gather_object([rank, f"r{rank}"]),
        "gather_object_value": trainer.gather_object({"rank": rank}),
        "broadcast_object_list": objects,
        "reduce": {r: trainer.reduce(mine, reduction=r).tolist() for r in reductions},
        "reduce_default": trainer.reduce(mine).tolist(),
        "reduce_scaled": trainer.reduce(mine, "sum", scale=0.5).tolist(),
        "method_reduce": {r: accelerator.reduce(mine, r).tolist() for r in ("sum", "max", "min")},
        "pad": trainer.pad_across_processes(ragged, dim=0, pad_index=-1).tolist(),
        "pad_first": trainer.pad_across_processes(ragged, pad_first=True).tolist(),
        "wait": trainer.wait_for_everyone(),
    }


def decorators_and_trigger() -> dict[str, Any]:
    accelerator = Accelerator()

    @accelerator.on_process(process_index=1)
    def on_one() -> str:
        return "ran"

    @accelerator.on_local_process(local_process_index=0)
    def on_local_zero() -> str:
        return "ran"

    def here() -> int:
        return accelerator.process_index

    checks = [accelerator.check_trigger()]
    if accelerator.process_index == 1:
        accelerator.set_trigger()  # one process sets it, every process sees it
    checks += [accelerator.check_trigger(), accelerator.check_trigger()]
    return {
        "main": accelerator.on_main_process(here)(),
        "local_main": accelerator.on_local_main_process(here)(),
        "last": accelerator.on_last_process(here)(),
        "process_1": on_one(),
        "process_0_direct": accelerator.on_process(here, process_index=0)(),
        "local_0": on_local_zero(),
        "checks": checks,
    }


def forced_sync(rank: int) -> dict[str, Any]:
    """Two forwards under no_sync, a backward, then one inside trigger_sync_in_backward."""
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Linear(3, 1))
    inputs = torch.arange(6.0).reshape(2, 3) + rank
    with accelerator.no_sync(model):
        loss_a = model(inputs[:1]).sum()
        loss_b = model(inputs[1:]).sum()
    accelerator.backward(loss_a)
    with accelerator.trigger_sync_in_backward(model):
        accelerator.backward(loss_b)
    local = inputs.sum(0, keepdim=True)  # this process's own gradient of loss_a + loss_b
    expected = accelerator.reduce(local, "mean")
    return {
        "grad": model.module.weight.grad.tolist(),
        "expected": expected.tolist(),
        "local": local.tolist(),
    }


def free_prepare(rank: int) -> dict[str, Any]:
    prepared = trainer.prepare_data_loader(DataLoader(range(10), batch_size=3))
    seen = [batch.tolist() for batch in prepared]
    shuffled = trainer.prepare_data_loader(
        DataLoader(range(12), batch_size=3, shuffle=True), use_seedable_sampler=True, data_seed=7
    )
    everything = torch.cat([trainer.gather(b) for b in shuffled]).tolist()
    return {"free": seen, "free_len": len(prepared), "shuffled_all": sorted(everything)}


class Rows(Dataset):
    """Reads a whole batch of indices at once (``sampler=BatchSampler``, ``batch_size=None``)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, indices: list[int]) -> torch.Tensor:
        return torch.tensor(indices)


def batch_sampler_as_sampler() -> dict[str, Any]:
    accelerator = Accelerator()
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    prepared = accelerator.prepare(DataLoader(Rows(), sampler=sampler, batch_size=None))
    batches, metrics = [], []
    for batch in prepared:
        batches.append(batch.tolist())
        metrics += accelerator.gather_for_metrics(batch).tolist()
    return {"batches": batches, "metrics": metrics}


def own_generator_round_trip(out: Path) -> dict[str, Any]:
    """save_state at an epoch's end, one more epoch, load_state, that epoch again."""
    accelerator = Accelerator()
    generator = torch.Generator().manual_seed(100 + accelerator.process_index)  # unlike on purpose
    prepared = accelerator.prepare(
        DataLoader(range(16), batch_size=2, shuffle=True, generator=generator)
    )

    def epoch() -> list[list[int]]:
        return [accelerator.gather(batch).tolist() for batch in prepared]

    first = epoch()
    accelerator.save_state(out / "generator_state")
    second = epoch()
    accelerator.load_state(out / "generator_state")
    return {"first": first, "second": second, "second_again": epoch()}


# ---- Accelerate's training_check (accelerate/test_utils/scripts/test_script.py) ---------------
class Regression(Dataset):
    """y = 2x + 3 + noise, as dicts (Accelerate's RegressionDataset, without numpy)."""

    def __init__(self, length: int) -> None:
        generator = torch.Generator().manual_seed(42)
        self.x = torch.randn(length, generator=generator)
        self.y = 2 * self.x + 3 + 0.1 * torch.randn(length, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.0))
        self.b = torch.nn.Parameter(torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b


class SeedableRandomSampler(RandomSampler):
    """Accelerate's: each pass reseeds the generator with ``initial seed + epoch``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self):
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.epoch += 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def baseline_loader(dataset, generator, batch_size: int, seedable: bool) -> DataLoader:
    if seedable:
        sampler = SeedableRandomSampler(dataset, generator=generator, num_samples=len(dataset))
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)


def train(model, optimizer, loader, backward) -> torch.nn.Module:
    for _ in range(3):
        for batch in loader:
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            backward(loss)
            optimizer.step()
    return model


def training_check(seedable: bool) -> dict[str, float]:
    processes, batch_size = torch.distributed.get_world_size(), 8
    generator = torch.Generator()
    torch.manual_seed(42)
    generator.manual_seed(42)
    dataset = Regression(batch_size * 4 * processes)
    model = RegressionModel()  # one process, the global batch
    loader = baseline_loader(dataset, generator, batch_size * processes, seedable)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    baseline = train(model, optimizer, loader, lambda loss: loss.backward())
    differences = {}
    for split in (False, True):
        config = DataLoaderConfiguration(
            split_batches=split, use_seedable_sampler=seedable and split
        )
        accelerator = Accelerator(dataloader_config=config)
        size = batch_size * processes if split else batch_size
        loader = baseline_loader(dataset, generator, size, seedable)
        model = RegressionModel()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
        torch.manual_seed(42)  # after prepare, as Accelerate's script does
        generator.manual_seed(42)
        trained = accelerator.unwrap_model(train(model, optimizer, loader, accelerator.backward))
        differences[f"split={split}"] = max(
            (trained.a - baseline.a).abs().item(), (trained.b - baseline.b).abs().item()
        )
    differences["baseline_a"] = baseline.a.item()
    return differences


def main(out: Path) -> None:
    facts: dict[str, Any] = first_collective()
    rank = torch.distributed.get_rank()
    facts.update(operations(rank))
    facts["decorators"] = decorators_and_trigger()
    facts["forced_sync"] = forced_sync(rank)
    facts.update(free_prepare(rank))
    facts["batch_sampler_as_sampler"] = batch_sampler_as_sampler()
    facts["own_generator"] = own_generator_round_trip(out)
    facts["training_check"] = training_check(seedable=False)
    facts["training_check_seedable"] = training_check(seedable=True)
    (out / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
