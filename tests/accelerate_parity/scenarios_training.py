"""Training scenarios: losses per step, final parameters, accumulation sync points, resume.

Every run builds the same MLP (`kit.model`, seeded apart from the global generator), so any
difference in losses comes from the data each process saw, the gradients it applied or the
random draws its framework made.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from tests.accelerate_parity.kit import (
    Side,
    dataset,
    ids,
    loader,
    loss_of,
    model,
    parameters,
    scenario,
    scratch,
)


def _optimizer(net: torch.nn.Module, kind: str) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.01)
    return torch.optim.SGD(net.parameters(), lr=0.1)


def _halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)


def _train(
    side: Side,
    *,
    n: int = 24,
    batch_size: int = 4,
    epochs: int = 2,
    dropout: float = 0.0,
    optimizer: str = "sgd",
    schedule: bool = False,
    clip: float | None = None,
    accumulation: int = 1,
    evaluate: bool = False,
    config: dict[str, Any] | None = None,
    **loader_options: Any,
) -> dict[str, Any]:
    accelerator = side.accelerator(
        dataloader_config=side.loader_config(**(config or {})),
        gradient_accumulation_steps=accumulation,
    )
    net = model(dropout)
    opt = _optimizer(net, optimizer)
    objects: list[Any] = [net, opt, loader(n, batch_size, **loader_options), loader(9, 2)]
    if schedule:
        objects.append(_halving(opt))
    prepared = accelerator.prepare(*objects)
    net, opt, train, evaluation = prepared[:4]
    facts: dict[str, Any] = {"losses": [], "lr": [], "norms": [], "eval": []}
    for _ in range(epochs):
        net.train()
        for batch in train:
            with accelerator.accumulate(net):
                loss = loss_of(net, batch)
                accelerator.backward(loss)
                if clip is not None:
                    facts["norms"].append(
                        float(accelerator.clip_grad_norm_(net.parameters(), clip))
                    )
                opt.step()
                if schedule:
                    prepared[4].step()
                opt.zero_grad()
            facts["losses"].append(loss.item())
            facts["lr"].append(opt.param_groups[0]["lr"])
        if evaluate:
            net.eval()
            errors = []
            with torch.no_grad():
                for batch in evaluation:
                    error = (net(batch[0]) - batch[1]).pow(2).reshape(-1)
                    errors.append(accelerator.gather_for_metrics(error))
            facts["eval"].append([len(torch.cat(errors)), torch.cat(errors).mean().item()])
    facts["params"] = parameters(accelerator.unwrap_model(net))
    return facts


TRAIN_CASES: dict[str, dict[str, Any]] = {
    "sgd": {},
    "adamw_schedule_clip": {"optimizer": "adamw", "schedule": True, "clip": 0.5},
    "shuffled": {"shuffle": True},
    "shuffled_generator": {"shuffle": True, "generator": torch.Generator().manual_seed(42)},
    "shuffled_dropout_evaluate": {"shuffle": True, "dropout": 0.2, "evaluate": True},
    "seedable_sampler": {"shuffle": True, "config": {"use_seedable_sampler": True}},
    "split_batches": {"batch_size": 8, "config": {"split_batches": True}},
    "uneven_last_batch": {"n": 22, "evaluate": True},
    "accumulate_2_schedule": {"n": 20, "batch_size": 2, "accumulation": 2, "schedule": True},
    "dispatch_batches": {"config": {"dispatch_batches": True}},
    "unshuffled_dropout": {"dropout": 0.2, "epochs": 3},
    "data_seed": {"shuffle": True, "config": {"use_seedable_sampler": True, "data_seed": 7}},
}


def _train_case(options: dict[str, Any]) -> Any:
    def run(side: Side) -> dict[str, Any]:
        generator = options.get("generator")
        if generator is not None:
            generator.manual_seed(42)  # the same order on both sides, whichever runs first
        return _train(side, **options)

    return run


for _name, _options in TRAIN_CASES.items():
    scenario(f"train/{_name}")(_train_case(_options))


# ---- gradient accumulation: which batches synchronise and step ------------------------------
def _accumulation_case(epochs: int = 2, n: int = 10, **plugin: Any) -> Any:
    def run(side: Side) -> list[dict[str, Any]]:
        accelerator = side.accelerator(
            gradient_accumulation_plugin=side.accumulation_plugin(**plugin)
        )
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net, opt, train, sched = accelerator.prepare(net, opt, loader(n, 2), _halving(opt))
        inner = accelerator.unwrap_model(net)
        rows = []
        for _ in range(epochs):
            for batch in train:
                before = inner[-1].bias.item()
                with accelerator.accumulate(net):
                    accelerator.backward(loss_of(net, batch))
                    row = {"sync": accelerator.sync_gradients, "grad": inner[-1].bias.grad.item()}
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                row["stepped"] = inner[-1].bias.item() != before
                row["lr"] = opt.param_groups[0]["lr"]
                row["end"] = bool(accelerator.gradient_state.end_of_dataloader)
                rows.append(row)
        return rows

    return run


ACCUMULATION_CASES: dict[str, dict[str, Any]] = {
    "steps_2": {"num_steps": 2},
    "steps_3_no_dataloader_sync": {"num_steps": 3, "sync_with_dataloader": False},
    "sync_each_batch": {"num_steps": 2, "sync_each_batch": True},
    "adjust_scheduler_false": {"num_steps": 2, "adjust_scheduler": False},
    "steps_1": {"num_steps": 1},
}
for _name, _plugin in ACCUMULATION_CASES.items():
    scenario(f"accumulation/{_name}")(_accumulation_case(**_plugin))


@scenario("accumulation/one_cycle_schedule")
def _one_cycle_schedule(side: Side) -> dict[str, Any]:
    """OneCycleLR sized to one process's optimizer steps (10 batches, 2 per step): it anneals to
    its end (on 2 processes it steps once per process per optimizer step, as Accelerate's), with
    the default plugin and with ``adjust_scheduler=False``; counting the accumulation batches cut
    it short."""
    runs = {}
    for adjust in (True, False):
        accelerator = side.accelerator(
            gradient_accumulation_plugin=side.accumulation_plugin(
                num_steps=2, adjust_scheduler=adjust
            )
        )
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        train = loader(10 * accelerator.num_processes, 1)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=5)
        net, opt, train, sched = accelerator.prepare(net, opt, train, sched)
        lrs = []
        for batch in train:
            with accelerator.accumulate(net):
                accelerator.backward(loss_of(net, batch))
                opt.step()
                sched.step()
                opt.zero_grad()
            lrs.append(round(opt.param_groups[0]["lr"], 8))
        runs[f"adjust_{adjust}"] = {"lr": lrs, "count": sched.scheduler.state_dict()["_step_count"]}
    return runs


@scenario("accumulation/evaluation_inside_last_batch")
def _evaluation_inside_last_batch(side: Side) -> dict[str, Any]:
    """An evaluation loop over another prepared loader, run inside the epoch's last training
    batch before its step: that batch still ends the window and steps (3 steps, 4 batches)."""
    accelerator = side.accelerator(gradient_accumulation_steps=3)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt, train, evaluation = accelerator.prepare(net, opt, loader(8, 2), loader(4, 2))
    sync, ends = [], []
    for _ in range(2):
        for batch in train:
            if accelerator.gradient_state.end_of_dataloader:
                with torch.no_grad():
                    for other in evaluation:
                        loss_of(net, other)
            ends.append(bool(accelerator.gradient_state.end_of_dataloader))
            with accelerator.accumulate(net):
                accelerator.backward(loss_of(net, batch))
                sync.append(accelerator.sync_gradients)
                opt.step()
                opt.zero_grad()
    return {"sync": sync, "end": ends, "parameters": parameters(accelerator.unwrap_model(net))}


def _rank_batches(accelerator: Any, count: int) -> list[tuple[torch.Tensor, ...]]:
    """Hand-made batches that differ between processes, so a sync shows in the gradients."""
    rows = dataset(4 * count, seed=10 + accelerator.process_index)
    return [rows[2 * i : 2 * i + 2] for i in range(count)]


def _bias_grad(accelerator: Any, net: torch.nn.Module) -> float:
    return accelerator.unwrap_model(net)[-1].bias.grad.item()


@scenario("accumulation/without_dataloader")
def _without_dataloader(side: Side) -> list[bool]:
    """No prepared loader: only the count decides (3 steps, 7 batches)."""
    accelerator = side.accelerator(gradient_accumulation_steps=3)
    net = accelerator.prepare(model())
    pattern = []
    for batch in _rank_batches(accelerator, 7):
        with accelerator.accumulate(net):
            accelerator.backward(loss_of(net, batch))
            pattern.append(accelerator.sync_gradients)
    return pattern


@scenario("accumulation/no_sync")
def _no_sync(side: Side) -> dict[str, float]:
    """A backward inside ``no_sync`` keeps local gradients; the next one outside reduces the sum."""
    accelerator = side.accelerator()
    net = accelerator.prepare(model())
    first, second = _rank_batches(accelerator, 2)
    with accelerator.no_sync(net):
        accelerator.backward(loss_of(net, first))
    local = _bias_grad(accelerator, net)
    accelerator.backward(loss_of(net, second))
    return {"inside": local, "after": _bias_grad(accelerator, net)}


@scenario("accumulation/trigger_sync_in_backward")
def _trigger_sync_in_backward(side: Side) -> dict[str, float]:
    """Inside ``no_sync``, ``trigger_sync_in_backward`` makes the next backward reduce."""
    accelerator = side.accelerator()
    net = accelerator.prepare(model())
    first, second = _rank_batches(accelerator, 2)
    with accelerator.no_sync(net):
        accelerator.backward(loss_of(net, first))
        local = _bias_grad(accelerator, net)
        with accelerator.trigger_sync_in_backward(net):
            accelerator.backward(loss_of(net, second))
    return {"inside": local, "triggered": _bias_grad(accelerator, net)}


# ---- save_state / load_state: a resumed run against an uninterrupted one ---------------------
class Counter:
    """A registered object: its count must come back with the checkpoint."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def _reseed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _resume_case(
    *, config: dict[str, Any], dropout: float, mid_epoch: int, shuffle: bool = True
) -> Any:
    """Epoch 0 (or its first ``mid_epoch`` batches), save; the rest and epoch 1, 2: both ways."""

    def build(side: Side) -> tuple[Any, ...]:
        accelerator = side.accelerator(dataloader_config=side.loader_config(**config))
        net = model(dropout)
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        prepared = accelerator.prepare(net, opt, loader(20, 2, shuffle=shuffle), _halving(opt))
        counter = Counter()
        accelerator.register_for_checkpointing(counter)
        return (accelerator, *prepared, counter)

    def epoch(
        parts: tuple[Any, ...], data: Any, facts: dict[str, Any], key: str, stop: int = -1
    ) -> None:
        accelerator, net, opt, _, sched, counter = parts
        for step, batch in enumerate(data):
            if step == stop:
                break
            loss = loss_of(net, batch)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            counter.steps += 1
            facts[key].append(loss.item())
            facts[f"{key}_ids"].append(ids(batch))

    def go_on(parts: tuple[Any, ...], facts: dict[str, Any], key: str) -> None:
        """The rest of the interrupted epoch (Accelerate's skip_first_batches), then 2 epochs."""
        if mid_epoch:
            epoch(parts, parts[0].skip_first_batches(parts[3], mid_epoch), facts, key)
        for _ in range(2):
            epoch(parts, parts[3], facts, key)

    def run(side: Side) -> dict[str, Any]:
        directory = str(scratch() / "checkpoint")
        keys = ("before_save", "uninterrupted", "resumed")
        facts: dict[str, Any] = {k: [] for key in keys for k in (key, f"{key}_ids")}
        whole = build(side)
        epoch(whole, whole[3], facts, "before_save", mid_epoch or -1)
        whole[0].save_state(directory)
        go_on(whole, facts, "uninterrupted")
        params = parameters(whole[0].unwrap_model(whole[1]))
        _reseed()
        resumed = build(side)
        resumed[0].load_state(directory)
        facts["counter_loaded"] = resumed[5].steps
        go_on(resumed, facts, "resumed")
        facts["params_equal"] = parameters(resumed[0].unwrap_model(resumed[1])) == params
        facts["params"] = params
        return facts

    return run


RESUME_CASES: dict[str, dict[str, Any]] = {
    "epoch_end": {"config": {}, "dropout": 0.0, "mid_epoch": 0},
    "epoch_end_dropout": {"config": {}, "dropout": 0.2, "mid_epoch": 0},
    "epoch_end_seedable": {
        "config": {"use_seedable_sampler": True},
        "dropout": 0.0,
        "mid_epoch": 0,
    },
    "mid_epoch_seedable": {
        "config": {"use_seedable_sampler": True},
        "dropout": 0.0,
        "mid_epoch": 2,
    },
    "unshuffled_dropout": {"config": {}, "dropout": 0.2, "mid_epoch": 0, "shuffle": False},
    "mid_epoch_data_seed": {
        "config": {"use_seedable_sampler": True, "data_seed": 7},
        "dropout": 0.0,
        "mid_epoch": 3,
    },
    "unshuffled_mid_epoch": {"config": {}, "dropout": 0.2, "mid_epoch": 3, "shuffle": False},
}
for _name, _case in RESUME_CASES.items():
    scenario(f"resume/{_name}")(_resume_case(**_case))


@scenario("resume/saved_in_the_epochs_last_batch")
def _saved_in_the_epochs_last_batch(side: Side) -> dict[str, Any]:
    """``save_state`` inside the loop at the epoch's last batch (Accelerate's example saves every
    N steps); resumed, the next epochs replay the run that went on (shuffled, with dropout)."""

    def build() -> tuple[Any, ...]:
        accelerator = side.accelerator()
        net = model(0.2)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        return (accelerator, *accelerator.prepare(net, opt, loader(8, 2, shuffle=True)))

    def train(parts: tuple[Any, ...], rows: list[Any], save_to: str | None = None) -> None:
        accelerator, net, opt, data = parts
        for index, batch in enumerate(data):
            loss = loss_of(net, batch)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            rows.append((ids(batch), round(loss.item(), 6)))
            if save_to is not None and index == len(data) - 1:
                accelerator.save_state(save_to)

    directory = str(scratch() / "checkpoint")
    facts: dict[str, Any] = {"first": [], "uninterrupted": [], "resumed": []}
    whole = build()
    train(whole, facts["first"], save_to=directory)
    for _ in range(2):
        train(whole, facts["uninterrupted"])
    _reseed()
    resumed = build()
    resumed[0].load_state(directory)
    for _ in range(2):
        train(resumed, facts["resumed"])
    facts["replayed"] = facts["resumed"] == facts["uninterrupted"]
    return facts


@scenario("resume/state_pre_hooks")
def _state_pre_hooks(side: Side) -> dict[str, Any]:
    """diffusers' pattern: the save hook writes model 0 its own way into ``output_dir`` (main
    process) and pops its weights; the load hook reads it back from ``input_dir`` and pops the
    model; ``save_state`` / ``load_state`` handle the rest. A removed hook is not called."""
    from safetensors.torch import load_file, save_file

    facts: dict[str, Any] = {"calls": []}
    accelerator = side.accelerator()

    def save_hook(models: list[Any], weights: list[Any], output_dir: str) -> None:
        facts["calls"].append(("save", len(models), len(weights), os.path.isdir(output_dir)))
        if accelerator.is_main_process:
            os.makedirs(os.path.join(output_dir, "custom"), exist_ok=True)
            state = {k: v.contiguous() for k, v in weights.pop(0).items()}
            save_file(state, os.path.join(output_dir, "custom", "net.safetensors"))
        else:
            weights.pop(0)

    def load_hook(models: list[Any], input_dir: str) -> None:
        facts["calls"].append(("load", len(models), "custom" in os.listdir(input_dir)))
        net = models.pop(0)
        accelerator.unwrap_model(net).load_state_dict(
            load_file(os.path.join(input_dir, "custom", "net.safetensors"))
        )

    def never(*args: Any) -> None:
        facts["calls"].append("removed hook called")

    directory = str(scratch() / "hooked")
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt, data = accelerator.prepare(net, opt, loader(8, 2))
    removed = [accelerator.register_save_state_pre_hook(never)]
    accelerator.register_save_state_pre_hook(save_hook)
    removed.append(accelerator.register_load_state_pre_hook(never))
    accelerator.register_load_state_pre_hook(load_hook)
    for handle in removed:
        handle.remove()
    for batch in data:
        accelerator.backward(loss_of(net, batch))
        opt.step()
        opt.zero_grad()
    saved = parameters(accelerator.unwrap_model(net))
    accelerator.save_state(directory)
    accelerator.wait_for_everyone()
    with torch.no_grad():
        for parameter in accelerator.unwrap_model(net).parameters():
            parameter.zero_()
    accelerator.load_state(directory)
    facts["restored"] = parameters(accelerator.unwrap_model(net)) == saved
    return facts


# ---- Accelerate's training_check: N processes end where one process with the global batch does
def _training_check(*, split: bool, seedable: bool, generator: bool) -> Any:
    def run(side: Side) -> dict[str, Any]:
        config = side.loader_config(split_batches=split, use_seedable_sampler=seedable)
        accelerator = side.accelerator(dataloader_config=config)
        world = accelerator.num_processes
        global_batch = 16
        rows = dataset(64, seed=42)
        shuffler = torch.Generator().manual_seed(42) if generator else None
        facts: dict[str, Any] = {}
        if generator:  # the plain-torch run with the global batch (Accelerate's mock_training)
            net = model()
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(3):
                for batch in DataLoader(rows, global_batch, shuffle=True, generator=shuffler):
                    opt.zero_grad()
                    loss_of(net, batch).backward()
                    opt.step()
            baseline = parameters(net)
        size = global_batch if split else global_batch // world
        data = DataLoader(rows, batch_size=size, shuffle=True, generator=shuffler)
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        train, net, opt = accelerator.prepare(data, net, opt)
        if generator:
            shuffler.manual_seed(42)
        for _ in range(3):
            for batch in train:
                net.zero_grad()
                accelerator.backward(loss_of(net, batch))
                opt.step()
        facts["params"] = parameters(accelerator.unwrap_model(net))
        if generator:
            gap = max(abs(a - b) for a, b in zip(baseline, facts["params"]))
            facts["max_gap_to_baseline"] = gap
            facts["matches_baseline"] = gap <= 1e-5
        return facts

    return run


for _name, _flags in {
    "generator": {"split": False, "seedable": False, "generator": True},
    "generator_split_batches": {"split": True, "seedable": False, "generator": True},
    "seedable_sampler": {"split": False, "seedable": True, "generator": False},
    "plain_shuffle": {"split": False, "seedable": False, "generator": False},
}.items():
    scenario(f"training_check/{_name}")(_training_check(**_flags))


@scenario("resume/mid_accumulation_window")
def _mid_accumulation_window(side: Side) -> dict[str, Any]:
    """save_state after 4 batches of 3-batch windows, load_state into a fresh Accelerator:
    the next batches go on with the interrupted window (Accelerate saves its step count)."""
    directory = str(scratch() / "mid_window")

    def run(accelerator: Any, batches: int) -> list[bool]:
        net = accelerator.prepare(model())
        optimizer = accelerator.prepare(torch.optim.SGD(net.parameters(), lr=0.1))
        if os.path.isdir(directory):
            accelerator.load_state(directory)
        syncs = []
        for batch in list(loader(16))[:batches]:  # a plain list: no dataloader end to sync at
            with accelerator.accumulate(net):
                accelerator.backward(loss_of(net, batch))
                optimizer.step()
                optimizer.zero_grad()
            syncs.append(bool(accelerator.sync_gradients))
        return syncs

    first = side.accelerator(gradient_accumulation_steps=3)
    before = run(first, 4)
    first.save_state(directory)
    first.wait_for_everyone()
    after = run(side.accelerator(gradient_accumulation_steps=3), 3)
    return {"before": before, "after": after}
