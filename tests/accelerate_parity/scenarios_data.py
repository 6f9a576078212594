"""Data scenarios: which samples each process sees, in which order, and what gathering returns.

Each case prepares one DataLoader under a ``DataLoaderConfiguration`` (or with the free function
``prepare_data_loader``) and records, per epoch, the sample numbers of every batch this process
got, ``len()`` of the prepared loader and ``end_of_dataloader`` per batch; the
``gather_for_metrics`` cases record what each step's gather returned.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from tests.accelerate_parity.kit import (
    Side,
    Stream,
    dataset,
    error_fact,
    ids,
    jsonable,
    loader,
    scenario,
)


def _length(prepared: Any) -> int | None:
    try:
        return len(prepared)
    except TypeError:
        return None


def _walk(accelerator: Any, prepared: Any, epochs: int = 2) -> dict[str, Any]:
    """Every batch's sample numbers per epoch, ``len()``, and the last epoch's end flags (as
    ``accelerator.gradient_state`` saw them)."""
    facts: dict[str, Any] = {"len": _length(prepared), "epochs": []}
    for _ in range(epochs):
        seen, ends = [], []
        for batch in prepared:
            seen.append(ids(batch))
            ends.append(bool(accelerator.gradient_state.end_of_dataloader))
        facts["epochs"].append(seen)
    facts["end_of_dataloader"] = ends
    return facts


def _order_case(make_loader: Any, **config: Any) -> Any:
    def run(side: Side) -> dict[str, Any]:
        accelerator = side.accelerator(dataloader_config=side.loader_config(**config))
        return _walk(accelerator, accelerator.prepare(make_loader()))

    return run


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch_sampler_loader(as_sampler: bool) -> DataLoader:
    rows = dataset(10)
    batches = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    if as_sampler:  # the dataset reads a whole batch of indices at once
        return DataLoader(rows, sampler=batches, batch_size=None)
    return DataLoader(rows, batch_sampler=batches)


ORDER_CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "plain": (lambda: loader(10, 3), {}),
    "exact": (lambda: loader(12, 3), {}),
    "even_batches_false": (lambda: loader(10, 3), {"even_batches": False}),
    "drop_last": (lambda: loader(10, 3, drop_last=True), {}),
    "split_batches": (lambda: loader(10, 4), {"split_batches": True}),
    "split_batches_even_false": (
        lambda: loader(10, 4),
        {"split_batches": True, "even_batches": False},
    ),
    "shuffle": (lambda: loader(10, 3, shuffle=True), {}),
    "shuffle_generator": (lambda: loader(10, 3, shuffle=True, generator=_seeded(42)), {}),
    "shuffle_split_batches": (lambda: loader(12, 4, shuffle=True), {"split_batches": True}),
    "seedable_sampler": (lambda: loader(10, 3, shuffle=True), {"use_seedable_sampler": True}),
    "seedable_sampler_data_seed": (
        lambda: loader(10, 3, shuffle=True),
        {"use_seedable_sampler": True, "data_seed": 7},
    ),
    "dispatch_batches": (lambda: loader(10, 3), {"dispatch_batches": True}),
    "dispatch_batches_split": (
        lambda: loader(10, 4),
        {"dispatch_batches": True, "split_batches": True},
    ),
    "iterable": (lambda: DataLoader(Stream(10), batch_size=3), {}),
    "iterable_split_batches": (
        lambda: DataLoader(Stream(10), batch_size=4),
        {"split_batches": True},
    ),
    "iterable_even_false": (lambda: DataLoader(Stream(10), batch_size=3), {"even_batches": False}),
    "batch_sampler_as_sampler": (lambda: _batch_sampler_loader(as_sampler=True), {}),
    "custom_batch_sampler": (lambda: _batch_sampler_loader(as_sampler=False), {}),
}
for _name, (_make, _config) in ORDER_CASES.items():
    scenario(f"batch_order/{_name}")(_order_case(_make, **_config))


@scenario("batch_order/data_seed_changes_order")
def _data_seed_changes_order(side: Side) -> dict[str, Any]:
    """Two data seeds, same everything else: the orders differ; the same seed repeats."""
    orders = []
    for data_seed in (7, 8, 7):
        config = side.loader_config(use_seedable_sampler=True, data_seed=data_seed)
        accelerator = side.accelerator(dataloader_config=config)
        orders.append(_walk(accelerator, accelerator.prepare(loader(10, 2, shuffle=True)), 1))
    return {"7_vs_8_equal": orders[0] == orders[1], "7_vs_7_equal": orders[0] == orders[2]}


@scenario("batch_order/seedable_set_epoch_replays")
def _seedable_set_epoch_replays(side: Side) -> dict[str, Any]:
    """Accelerate's ``check_seedable_sampler``: same seed and ``set_epoch(0)`` replay 3 epochs."""
    accelerator = side.accelerator(dataloader_config=side.loader_config(use_seedable_sampler=True))
    prepared = accelerator.prepare(loader(10, 2, shuffle=True))
    first = [ids(b) for _ in range(3) for b in prepared]
    torch.manual_seed(42)
    prepared.set_epoch(0)
    again = [ids(b) for _ in range(3) for b in prepared]
    return {"first": first, "replayed_equal": first == again}


# ---- prepare_data_loader, the free function ---------------------------------------------------
def _free_case(make_loader: Any, **options: Any) -> Any:
    def run(side: Side) -> dict[str, Any]:
        prepare_data_loader = side.function("prepare_data_loader")
        side.accelerator()  # the process state; the loader is not given to it
        prepared = prepare_data_loader(make_loader(), **options)
        return {"len": _length(prepared), "epochs": [[ids(b) for b in prepared] for _ in range(2)]}

    return run


FREE_CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "defaults": (lambda: loader(10, 3), {}),
    "explicit_process": (lambda: loader(10, 3), {"num_processes": 2, "process_index": 1}),
    "split_batches": (lambda: loader(10, 4), {"split_batches": True}),
    "even_batches_false": (lambda: loader(10, 3), {"even_batches": False}),
    "seedable_data_seed": (
        lambda: loader(10, 3, shuffle=True),
        {"use_seedable_sampler": True, "data_seed": 7},
    ),
    "put_on_device": (
        lambda: loader(10, 3),
        {"device": torch.device("cpu"), "put_on_device": True},
    ),
}
for _name, (_make, _options) in FREE_CASES.items():
    scenario(f"prepare_data_loader/{_name}")(_free_case(_make, **_options))


@scenario("prepare_data_loader/accelerator_sees_the_end")
def _free_loader_end(side: Side) -> dict[str, Any]:
    """An Accelerator's ``gradient_state`` while a loader from the free function runs: whether
    ``accumulate`` would sync at its last batch and ``gather_for_metrics`` trim there."""
    accelerator = side.accelerator()
    return _walk(accelerator, side.function("prepare_data_loader")(loader(10, 3)), epochs=1)


# ---- gather_for_metrics ---------------------------------------------------------------------
def _metric_input(how: str, batch: Any) -> tuple[Any, dict[str, Any]]:
    if how == "tensor":
        return batch[2], {}
    if how == "tuple":
        return (batch[2], batch[0][:, 0]), {}
    if how == "dict":
        return {"index": batch[2], "x": batch[0]}, {}
    if how == "list":
        return [batch[2], batch[0][:, 0]], {}
    if how == "one_item_list":
        return [batch[2]], {}
    if how == "nested":
        return {"pair": [batch[2], (batch[0],)], "index": {"i": batch[2]}}, {}
    if how == "objects":
        return ids(batch), {"use_gather_object": True}
    if how == "strings":
        return [f"s{i}" for i in ids(batch)], {}
    raise KeyError(how)


def _metrics_case(make_loader: Any, how: str, passes: int = 1, **config: Any) -> Any:
    def run(side: Side) -> dict[str, Any]:
        accelerator = side.accelerator(dataloader_config=side.loader_config(**config))
        prepared = accelerator.prepare(make_loader())
        steps = []
        for _ in range(passes):
            for batch in prepared:
                data, options = _metric_input(how, batch)
                steps.append(jsonable(accelerator.gather_for_metrics(data, **options)))
        return {"steps": steps}

    return run


METRIC_CASES: dict[str, tuple[Any, str, dict[str, Any]]] = {
    "tensor_9_by_2": (lambda: loader(9, 2), "tensor", {}),
    "tuple_9_by_2": (lambda: loader(9, 2), "tuple", {}),
    "dict_9_by_2": (lambda: loader(9, 2), "dict", {}),
    "list_9_by_2": (lambda: loader(9, 2), "list", {}),
    "one_item_list_9_by_2": (lambda: loader(9, 2), "one_item_list", {}),
    "nested_9_by_2": (lambda: loader(9, 2), "nested", {}),
    "objects_9_by_2": (lambda: loader(9, 2), "objects", {}),
    "strings_9_by_2": (lambda: loader(9, 2), "strings", {}),
    "tensor_9_by_5": (lambda: loader(9, 5), "tensor", {}),
    "tensor_10_by_5": (lambda: loader(10, 5), "tensor", {}),
    "tensor_9_by_4_split": (lambda: loader(9, 4), "tensor", {"split_batches": True}),
    "tensor_iterable_9_by_2": (lambda: DataLoader(Stream(9), batch_size=2), "tensor", {}),
    "tensor_9_by_2_shuffled": (lambda: loader(9, 2, shuffle=True), "tensor", {}),
}
for _name, (_make, _how, _config) in METRIC_CASES.items():
    scenario(f"gather_for_metrics/{_name}")(_metrics_case(_make, _how, **_config))
scenario("gather_for_metrics/two_passes")(_metrics_case(lambda: loader(9, 2), "tensor", passes=2))


@scenario("gather_for_metrics/objects_after_uneven_loop")
def _objects_after_uneven_loop(side: Side) -> Any:
    """``even_batches=False``: processes step unequally, so gather once after the loop."""
    accelerator = side.accelerator(dataloader_config=side.loader_config(even_batches=False))
    seen = [i for batch in accelerator.prepare(loader(9, 2)) for i in ids(batch)]
    return accelerator.gather_for_metrics(seen, use_gather_object=True)


@scenario("gather_for_metrics/padded_last_batch_without_even_batches")
def _padded_last_batch_without_even_batches(side: Side) -> dict[str, Any]:
    """``even_batches=False``, 14 samples by 4: the last batches differ in size across
    processes; padded to one size, gathering keeps only the real rows (the remainder)."""
    accelerator = side.accelerator(dataloader_config=side.loader_config(even_batches=False))
    steps = []
    for batch in accelerator.prepare(loader(14, 4)):
        padded = accelerator.pad_across_processes(batch[2], pad_index=-1)
        steps.append(jsonable(accelerator.gather_for_metrics(padded)))
    return {"steps": steps}


@scenario("gather_for_metrics/metric_value")
def _metric_value(side: Side) -> dict[str, Any]:
    """A mean over the whole evaluation set: each sample counted exactly once."""
    accelerator = side.accelerator()
    prepared = accelerator.prepare(loader(11, 3))
    values, count = torch.zeros(()), 0
    for batch in prepared:
        gathered = accelerator.gather_for_metrics(batch[1].reshape(-1))
        values, count = values + gathered.sum(), count + len(gathered)
    return {
        "count": count,
        "mean": float(values / count),
        "expected": float(dataset(11)[:][1].mean()),
    }


# ---- GradientState while loaders run ----------------------------------------------------------
@scenario("gradient_state/active_dataloader")
def _active_dataloader(side: Side) -> dict[str, Any]:
    accelerator = side.accelerator()
    train, evaluation = accelerator.prepare(loader(6, 2), loader(4, 2))
    state = accelerator.gradient_state
    facts: dict[str, Any] = {"before": state.active_dataloader is None, "batches": []}
    for step, _ in enumerate(train):
        row = {"train_active": state.active_dataloader is train, "end": state.end_of_dataloader}
        if step == 0:
            inner = []
            for _ in evaluation:
                inner.append([state.active_dataloader is evaluation, state.end_of_dataloader])
            row["inner"] = inner
            row["back_to_train"] = state.active_dataloader is train
        facts["batches"].append(row)
    facts["after"] = [state.active_dataloader is None, state.in_dataloader, state.end_of_dataloader]
    return facts


@scenario("gradient_state/break_and_restart")
def _break_and_restart(side: Side) -> dict[str, Any]:
    """Leaving a loop early, then iterating again from the start (Accelerate's test_dataloader_break)."""
    accelerator = side.accelerator()
    prepared = accelerator.prepare(loader(8, 2))
    state = accelerator.gradient_state
    for step, _ in enumerate(prepared):
        if step == 1:
            break
    after_break = [state.in_dataloader, state.end_of_dataloader]
    flags = [bool(state.end_of_dataloader) for _ in prepared]
    return {"after_break": after_break, "restart_end_flags": flags, "after": state.in_dataloader}


@scenario("process/facts")
def _process_facts(side: Side) -> dict[str, Any]:
    accelerator = side.accelerator()
    return {
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "is_main_process": accelerator.is_main_process,
        "is_local_main_process": accelerator.is_local_main_process,
        "is_last_process": accelerator.is_last_process,
        "distributed_type": str(getattr(accelerator.distributed_type, "value", "")),
        "device_type": accelerator.device.type,
        "use_distributed": accelerator.use_distributed,
        "mixed_precision": str(accelerator.mixed_precision),
        "world_size_env": int(os.environ.get("WORLD_SIZE", "1")),
    }


# ---- skip_first_batches ---------------------------------------------------------------------
SKIP_CASES: dict[str, Any] = {
    "prepared": lambda: loader(10, 2),
    "prepared_shuffled": lambda: loader(10, 2, shuffle=True, generator=_seeded(3)),
}


def _skip_case(make_loader: Any) -> Any:
    """Two passes over ``skip_first_batches(prepared, 2)``: both start at batch 2."""

    def run(side: Side) -> dict[str, Any]:
        accelerator = side.accelerator()
        skipped = accelerator.skip_first_batches(accelerator.prepare(make_loader()), 2)
        return _walk(accelerator, skipped)

    return run


for _name, _make in SKIP_CASES.items():
    scenario(f"skip_first_batches/{_name}")(_skip_case(_make))


@scenario("skip_first_batches/iterable_free_function")
def _skip_iterable(side: Side) -> dict[str, Any]:
    accelerator = side.accelerator()
    skipped = side.function("skip_first_batches")(DataLoader(Stream(10), batch_size=2), 2)
    return _walk(accelerator, skipped)


# ---- sizes a prepared loader reports --------------------------------------------------------------
@scenario("prepare/total_batch_size")
def _total_batch_size(side: Side) -> dict[str, Any]:
    """``total_batch_size`` / ``total_dataset_length`` of prepared loaders, as a script reads them
    to log the effective batch size, and whether they are DataLoaders to ``isinstance``: a batch size, ``split_batches``, a user's batch sampler.
    (On an iterable dataset Accelerate 1.15 raises AttributeError: tests/data/test_loader.py.)"""
    facts: dict[str, Any] = {}
    cases = {
        "batch_size": (lambda: loader(16, batch_size=4), {}),
        "split_batches": (lambda: loader(16, batch_size=4), {"split_batches": True}),
        "batch_sampler": (
            lambda: DataLoader(
                dataset(16), batch_sampler=BatchSampler(SequentialSampler(range(16)), 4, False)
            ),
            {},
        ),
    }
    for name, (build, options) in cases.items():
        accelerator = side.accelerator(dataloader_config=side.loader_config(**options))
        prepared = accelerator.prepare(build())
        try:
            facts[name] = [prepared.total_batch_size, prepared.total_dataset_length]
            facts[f"{name}_is_a_dataloader"] = isinstance(prepared, DataLoader)
        except AttributeError as err:
            facts[name] = error_fact(err)
    return facts
