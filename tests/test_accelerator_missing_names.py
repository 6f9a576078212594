"""Accelerate names an Accelerate script uses, on one process (issue #15 item 8): the
``on_*_process`` decorators, ``set_trigger`` / ``check_trigger``, ``trigger_sync_in_backward``,
the free ``prepare_data_loader``, ``DataLoaderConfiguration(data_seed=)``,
``GradientState.active_dataloader``, a ``BatchSampler`` given as a loader's sampler, and a
shuffling sampler's own generator kept (and saved).

The same names on 2 real processes: tests/distributed/test_missing_names.py.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from trainer import (
    Accelerator,
    CheckpointError,
    ConfigurationError,
    DataLoaderConfiguration,
    prepare_data_loader,
    skip_first_batches,
)
from trainer.data.loader import DataLoaderShard
from trainer.data.sharding import shard_data_loader

METHODS = (
    "on_main_process",
    "on_local_main_process",
    "on_last_process",
    "on_process",
    "on_local_process",
    "set_trigger",
    "check_trigger",
    "trigger_sync_in_backward",
    "reduce",
    "prepare_data_loader",
)


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("name", METHODS)
def test_accelerator_methods_have_accelerates_parameters(name):
    accelerate = pytest.importorskip("accelerate")
    ours = _parameters(getattr(Accelerator, name))
    theirs = _parameters(getattr(accelerate.Accelerator, name))
    assert ours[: len(theirs)] == theirs  # ours may add keyword-only ones (shard=)
    assert all(
        p.kind is p.KEYWORD_ONLY
        for p in list(inspect.signature(getattr(Accelerator, name)).parameters.values())[
            len(theirs) :
        ]
    )


def test_free_prepare_data_loader_has_accelerates_parameters():
    data_loader = pytest.importorskip("accelerate.data_loader")
    assert _parameters(prepare_data_loader) == _parameters(data_loader.prepare_data_loader)


def test_dataloader_configuration_fields_are_accelerates_in_order():
    utils = pytest.importorskip("accelerate.utils")
    ours = [(f.name, f.default) for f in dataclasses.fields(DataLoaderConfiguration)]
    theirs = [(f.name, f.default) for f in dataclasses.fields(utils.DataLoaderConfiguration)]
    assert ours == theirs


# ---- decorators -------------------------------------------------------------------------------
def test_every_decorator_runs_the_function_on_one_process():
    accelerator = Accelerator(cpu=True)

    @accelerator.on_main_process
    def main(x):
        """Doubles."""
        return 2 * x

    @accelerator.on_process(process_index=1)  # one process: runs anyway, as in Accelerate
    def second():
        return "second"

    @accelerator.on_local_process(local_process_index=3)
    def local_third():
        return "local"

    assert main(4) == 8 and main.__name__ == "main" and main.__doc__ == "Doubles."
    assert second() == "second" and local_third() == "local"
    assert accelerator.on_local_main_process(lambda: 1)() == 1
    assert accelerator.on_last_process(lambda: 2)() == 2
    assert accelerator.on_process(lambda: 3, process_index=0)() == 3
    assert accelerator.on_local_process(function=lambda: 4, local_process_index=0)() == 4


def test_a_decorator_without_its_function_or_index_says_how_to_write_it():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ConfigurationError, match=r"no\s+parentheses"):
        accelerator.on_main_process()
    with pytest.raises(ConfigurationError, match="on_local_main_process"):
        accelerator.on_local_main_process(None)
    with pytest.raises(ConfigurationError, match=r"on_process\(process_index=None"):
        accelerator.on_process(lambda: 1)
    with pytest.raises(ConfigurationError, match=r"local_process_index=-1"):
        accelerator.on_local_process(lambda: 1, local_process_index=-1)


# ---- triggers -------------------------------------------------------------------------------
def test_a_trigger_is_seen_once_then_reset():
    accelerator = Accelerator(cpu=True)
    assert accelerator.check_trigger() is False
    accelerator.set_trigger()
    assert int(accelerator.flag_tensor) == 1
    assert accelerator.check_trigger() is True
    assert accelerator.check_trigger() is False
    assert Accelerator(cpu=True).check_trigger() is False  # each Accelerator has its own flag


def test_trigger_sync_in_backward_leaves_a_plain_model_alone():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with Accelerator.trigger_sync_in_backward(model):
        accelerator.backward(model(torch.ones(1, 2)).sum())
    assert torch.equal(model.weight.grad, torch.ones(1, 2))


# ---- prepare_data_loader, the free function -------------------------------------------------
def _ids(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_free_prepare_data_loader_on_one_process_yields_the_loaders_batches():
    prepared = prepare_data_loader(DataLoader(range(7), batch_size=3))
    assert isinstance(prepared, DataLoaderShard)
    assert _ids(prepared) == [[0, 1, 2], [3, 4, 5], [6]]
    state = prepared.gradient_state  # its own: the loader belongs to no Accelerator
    seen = []
    for _ in prepared:
        seen.append((state.active_dataloader is prepared, state.end_of_dataloader))
    assert seen == [(True, False), (True, False), (True, True)]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]),
        ({"even_batches": False}, [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9]]]),
        (
            {"split_batches": True, "batch_size": 4},
            [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]],
        ),
    ],
)
def test_free_prepare_data_loader_shares_out_for_the_given_process(options, expected):
    batch_size = options.pop("batch_size", 3)
    for index in (0, 1):
        loader = DataLoader(range(10), batch_size=batch_size)
        prepared = prepare_data_loader(loader, None, 2, index, **options)  # Accelerate's order
        assert _ids(prepared) == expected[index]


def test_free_prepare_data_loader_puts_batches_on_the_device():
    prepared = prepare_data_loader(DataLoader(range(4), batch_size=2), "cpu", put_on_device=True)
    assert prepared.device == torch.device("cpu")
    assert prepare_data_loader(DataLoader(range(4), batch_size=2), "cpu").device is None


def test_free_prepare_data_loader_refuses_bad_input_with_the_fix():
    loader = DataLoader(range(4), batch_size=2)
    with pytest.raises(ConfigurationError, match="needs put_on_device=True"):
        prepare_data_loader(loader, dispatch_batches=True)
    with pytest.raises(ConfigurationError, match="below num_processes=2"):
        prepare_data_loader(loader, num_processes=2, process_index=2)
    with pytest.raises(ConfigurationError, match="expected a torch.utils.data.DataLoader"):
        prepare_data_loader(range(4))


# ---- DataLoaderConfiguration(data_seed=) --------------------------------------------------------
def _seeded_order(data_seed: int | None, global_seed: int) -> list[list[int]]:
    torch.manual_seed(global_seed)
    config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=data_seed)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    prepared = accelerator.prepare(DataLoader(range(12), batch_size=3, shuffle=True))
    return _ids(prepared) + _ids(prepared)  # two epochs


def test_data_seed_decides_the_shuffle_whatever_the_global_seed():
    assert _seeded_order(7, global_seed=0) == _seeded_order(7, global_seed=1)
    assert _seeded_order(7, global_seed=0) != _seeded_order(8, global_seed=0)
    assert _seeded_order(None, global_seed=0) != _seeded_order(None, global_seed=1)
    free = prepare_data_loader(
        DataLoader(range(12), batch_size=3, shuffle=True), use_seedable_sampler=True, data_seed=7
    )
    assert _ids(free) + _ids(free) == _seeded_order(7, global_seed=5)


@pytest.mark.parametrize("index", [0, 1])
def test_a_data_seed_gives_accelerates_order(index):
    # Failed before: the sampler's generator was seeded with seed + epoch + 1.
    data_loader = pytest.importorskip("accelerate.data_loader")
    options = {"num_processes": 2, "process_index": index, "use_seedable_sampler": True}
    orders = []
    for prepare in (data_loader.prepare_data_loader, prepare_data_loader):
        loader = DataLoader(range(10), batch_size=3, shuffle=True)
        prepared = prepare(loader, data_seed=7, **options)
        orders.append([_ids(prepared) for _ in range(3)])
    assert orders[0] == orders[1]


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "7"])
def test_a_bad_data_seed_is_refused(bad):
    with pytest.raises(ConfigurationError, match="data_seed"):
        DataLoaderConfiguration(use_seedable_sampler=True, data_seed=bad)


# ---- GradientState.active_dataloader --------------------------------------------------------
def test_active_dataloader_is_the_loader_being_iterated():
    accelerator = Accelerator(cpu=True)
    train, evaluation = accelerator.prepare(
        DataLoader(range(4), batch_size=2), DataLoader(range(2), batch_size=1)
    )
    state = accelerator.gradient_state
    assert state.active_dataloader is None
    rows = []
    for _ in train:
        inner = [state.active_dataloader is evaluation for _ in evaluation]
        rows.append((inner, state.active_dataloader is train))
    assert rows == [([True, True], True), ([True, True], True)]
    assert state.active_dataloader is None and not state.in_dataloader


# ---- a BatchSampler given as the sampler ------------------------------------------------------
def _reads_batches(n: int = 10, batch_size: int = 3) -> DataLoader:
    sampler = BatchSampler(SequentialSampler(range(n)), batch_size=batch_size, drop_last=False)
    return DataLoader(TensorDataset(torch.arange(n)), sampler=sampler, batch_size=None)


def test_a_batch_sampler_as_sampler_is_sharded_as_accelerate_does():
    # Failed before: "a DataLoader with batch_size=None cannot be sharded".
    config = DataLoaderConfiguration()
    parts = [
        shard_data_loader(_reads_batches(), num_processes=2, process_index=index, config=config)
        for index in (0, 1)
    ]
    assert [[b[0].tolist() for b in loader] for loader, _ in parts] == [
        [[0, 1, 2], [6, 7, 8]],
        [[3, 4, 5], [9, 0, 1]],
    ]
    assert [remainder for _, remainder in parts] == [10 % 6] * 2


def test_a_batch_sampler_as_sampler_is_prepared_skipped_and_shared_out():
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(_reads_batches())
    assert [b[0].tolist() for b in prepared] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [b[0].tolist() for b in skip_first_batches(_reads_batches(), 2)] == [[6, 7, 8], [9]]
    second = prepare_data_loader(_reads_batches(), num_processes=2, process_index=1)
    assert [b[0].tolist() for b in second] == [[3, 4, 5], [9, 0, 1]]


# ---- a shuffling sampler's own generator ------------------------------------------------------
def _shuffled(generator: torch.Generator) -> DataLoader:
    return DataLoader(range(12), batch_size=2, shuffle=True, generator=generator)


def test_a_loaders_own_generator_decides_the_order_as_in_a_plain_loader():
    accelerator = Accelerator(cpu=True)
    generator = torch.Generator().manual_seed(3)
    prepared = accelerator.prepare(_shuffled(generator))
    assert prepared.synchronized_generator is generator and prepared.seed is None
    generator.manual_seed(42)  # seeded after prepare, as Accelerate's test script does
    plain = _shuffled(torch.Generator().manual_seed(42))
    assert [_ids(prepared) for _ in range(3)] == [_ids(plain) for _ in range(3)]


def test_the_seedable_sampler_ignores_the_loaders_own_generator_state():
    config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=5)
    orders = []
    for generator_seed in (1, 2):
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        prepared = accelerator.prepare(_shuffled(torch.Generator().manual_seed(generator_seed)))
        assert prepared.synchronized_generator is None
        orders.append(_ids(prepared))
    assert orders[0] == orders[1]


def test_save_state_mid_epoch_replays_the_order_of_the_loaders_own_generator(tmp_path):
    # Failed before: the generator's state was not saved, so the resumed epoch reshuffled.
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(_shuffled(torch.Generator().manual_seed(3)))
    _ids(prepared)  # one whole epoch first
    seen = []
    for index, batch in enumerate(prepared):
        seen.append(batch.tolist())
        if index == 1:
            accelerator.save_state(tmp_path / "state")
    following = _ids(prepared)
    accelerator.load_state(tmp_path / "state")
    assert _ids(skip_first_batches(prepared, 2)) == seen[2:]
    assert _ids(prepared) == following


def test_a_foreign_generator_state_is_refused_naming_the_field():
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(_shuffled(torch.Generator()))
    with pytest.raises(CheckpointError, match="field 'generator'"):
        prepared.load_state_dict({"seed": None, "epoch": 0, "generator": torch.zeros(3)})


def test_a_random_sampler_given_its_generator_is_kept_too():
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(range(6), sampler=RandomSampler(range(6), generator=generator))
    assert prepare_data_loader(loader).synchronized_generator is generator


def test_free_memory_clear_and_the_smaller_facts_accelerate_scripts_read(tmp_path):
    import accelerate as hf

    def run(accelerator_class: type, **options) -> dict:
        accelerator = accelerator_class(cpu=True, **options)
        model, optimizer = accelerator.prepare(
            torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        )
        freed = accelerator.free_memory(model, optimizer)
        model = accelerator.prepare(torch.nn.Linear(2, 2))
        cleared = accelerator.clear(model)
        dispatched = torch.nn.Linear(2, 2)
        dispatched.hf_device_map = {"a": "cpu", "b": "disk"}
        return {
            "freed": freed,
            "cleared": cleared,
            "models_left": len(accelerator._models),
            "multi_device": accelerator.multi_device,
            "is_fsdp2": accelerator.is_fsdp2,
            "save_iteration": accelerator.save_iteration,
            "device_map": [
                accelerator.verify_device_map(torch.nn.Sequential(dispatched)),
                accelerator.verify_device_map(torch.nn.Linear(2, 2)),
            ],
        }

    from accelerate.state import AcceleratorState

    ours = run(Accelerator)
    AcceleratorState._reset_state(True)  # Accelerate's singleton: another test's settings
    try:
        theirs = run(hf.Accelerator)
    finally:
        AcceleratorState._reset_state(True)
    assert ours == theirs
    assert ours["freed"] == [None, None] and ours["device_map"] == [True, False]


# The names docs/migration/accelerate.md lists as not here.
NOT_HERE = {
    "lomo_backward",
    "has_lomo_optimizer",
    "deepspeed_ulysses_dl_adapter",
    "fp8_backend",
    "fp8_enabled",
    "has_fp8_handler",
    "delayed_fp8_autocast",
    "native_amp",
    "msamp_recipe_handler",
    "step",
}


def test_every_other_public_name_of_accelerates_accelerator_is_here():
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    theirs = accelerate.Accelerator(cpu=True)
    try:
        names = {n for n in dir(theirs) if not n.startswith("_")}
    finally:
        AcceleratorState._reset_state()
    ours = {n for n in dir(Accelerator(cpu=True)) if not n.startswith("_")}
    assert names - ours == NOT_HERE
