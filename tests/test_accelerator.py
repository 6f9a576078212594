"""The Accelerator on one process: prepare, accumulate, backward, collectives' one-process semantics."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer import Accelerator, DistributedType, GradientAccumulationPlugin, PartialState
from trainer.accelerator.optimizer import AcceleratedOptimizer, AcceleratedScheduler
from trainer.data import DataLoaderShard


def test_prepare_any_order_same_order_back():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = make_loader()
    marker = object()
    out = accelerator.prepare(scheduler, loader, marker, optimizer, model)
    assert isinstance(out[0], AcceleratedScheduler)
    assert isinstance(out[1], DataLoaderShard)
    assert out[2] is marker
    assert isinstance(out[3], AcceleratedOptimizer) and out[3].optimizer is optimizer
    assert out[4] is model
    assert accelerator.prepare(model) is model  # one object -> not a tuple


def test_facts_on_one_process():
    accelerator = Accelerator(cpu=True)
    assert accelerator.device == torch.device("cpu")
    assert (
        accelerator.process_index,
        accelerator.local_process_index,
        accelerator.num_processes,
    ) == (0, 0, 1)
    assert (
        accelerator.is_main_process
        and accelerator.is_local_main_process
        and accelerator.is_last_process
    )
    assert accelerator.distributed_type is DistributedType.NO
    assert accelerator.mixed_precision == "no"
    state = PartialState()
    assert state.num_processes == 1 and state.distributed_type is DistributedType.NO


def test_two_accelerators_keep_their_own_settings():
    first = Accelerator(cpu=True, gradient_accumulation_steps=4, mixed_precision="bf16")
    second = Accelerator(cpu=True)
    assert first.gradient_accumulation_steps == 4 and second.gradient_accumulation_steps == 1
    assert first.mixed_precision == "bf16" and second.mixed_precision == "no"


def _hand_written(
    accelerator: Accelerator, epochs: int, loader, *, clip: float | None = None
) -> torch.nn.Module:
    torch.manual_seed(0)
    module = LinearModule(lr=0.05)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    model, optimizer, prepared = accelerator.prepare(module, optimizer, loader)
    for _ in range(epochs):
        for x, y in prepared:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if clip is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad()
    return module


@pytest.mark.parametrize(("accumulate", "clip"), [(1, None), (2, None), (3, 0.3)])
def test_trainer_fit_equals_a_hand_written_accelerator_loop(tmp_path, accumulate, clip):
    loader = make_loader(n=28, batch_size=4)
    expected = _hand_written(
        Accelerator(cpu=True, gradient_accumulation_steps=accumulate), 2, loader, clip=clip
    )
    torch.manual_seed(0)
    module = LinearModule(lr=0.05)
    quiet_trainer(
        tmp_path, max_epochs=2, accumulate_grad_batches=accumulate, gradient_clip_val=clip
    ).fit(module, loader)
    for got, want in zip(module.parameters(), expected.parameters(), strict=True):
        assert torch.equal(got, want)


def test_accumulate_syncs_every_n_and_at_the_end_of_the_loader():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(4, 1)
    loader = accelerator.prepare(make_loader(n=20, batch_size=4))  # 5 batches
    flags = []
    for _ in loader:
        with accelerator.accumulate(model):
            flags.append(accelerator.sync_gradients)
    assert flags == [False, False, True, False, True]
    # The window restarts with the next epoch.
    flags = []
    for _ in loader:
        with accelerator.accumulate(model):
            flags.append(accelerator.sync_gradients)
    assert flags == [False, False, True, False, True]


def test_accumulation_plugin_without_dataloader_sync():
    plugin = GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    loader = accelerator.prepare(make_loader(n=12, batch_size=4))
    flags = []
    for _ in loader:
        with accelerator.accumulate(torch.nn.Linear(1, 1)):
            flags.append(accelerator.sync_gradients)
    assert flags == [False, True, False]
    with pytest.raises(trainer.ConfigurationError, match="either gradient_accumulation_steps or"):
        Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=plugin)


def test_prepared_optimizer_skips_step_and_zero_grad_while_accumulating():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 1)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(make_loader(n=8, batch_size=4))
    before = model.weight.detach().clone()
    batches = iter(loader)
    x, y = next(batches)
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    assert torch.equal(model.weight, before) and model.weight.grad is not None
    x, y = next(batches)
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(model.weight, before) and model.weight.grad is None
    assert optimizer.step_count == 1


def test_scheduler_steps_with_the_optimizer_only():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    optimizer, scheduler, loader = accelerator.prepare(
        opt, torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5), make_loader(n=16)
    )
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert scheduler.get_last_lr() == [0.25]  # 4 batches / 2 = 2 real steps


def test_scheduler_of_an_unprepared_optimizer_is_rejected():
    accelerator = Accelerator(cpu=True)
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    with pytest.raises(
        trainer.ConfigurationError, match="Pass its optimizer to accelerator.prepare"
    ):
        accelerator.prepare(torch.optim.lr_scheduler.StepLR(opt, 1))


def test_backward_divides_by_accumulation_steps():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    weight = torch.nn.Parameter(torch.tensor(1.0))
    accelerator.backward(weight * 8.0)
    assert weight.grad.item() == 2.0


def test_gather_reduce_pad_broadcast_on_one_process():
    accelerator = Accelerator(cpu=True)
    tree = {"a": torch.tensor(3.0), "b": [torch.arange(4).reshape(2, 2)]}
    gathered = accelerator.gather(tree)
    assert gathered["a"].shape == (1,) and torch.equal(gathered["b"][0], tree["b"][0])
    assert torch.equal(
        accelerator.reduce(torch.tensor([1.0, 2.0]), "mean"), torch.tensor([1.0, 2.0])
    )
    assert torch.equal(accelerator.reduce(torch.tensor(2.0), "sum", scale=3.0), torch.tensor(6.0))
    assert torch.equal(accelerator.pad_across_processes(torch.ones(3, 2), dim=1), torch.ones(3, 2))
    assert torch.equal(accelerator.broadcast(torch.tensor([5])), torch.tensor([5]))
    with pytest.raises(trainer.ConfigurationError, match="reduction='avg'"):
        accelerator.reduce(torch.tensor(1.0), "avg")


def test_gather_for_metrics_covers_exactly_the_dataset():
    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.arange(9).float())
    loader = accelerator.prepare(DataLoader(data, batch_size=4))
    seen = torch.cat([accelerator.gather_for_metrics(batch[0]) for batch in loader])
    assert torch.equal(seen, torch.arange(9).float())
    objects = [accelerator.gather_for_metrics(["x"], use_gather_object=True) for _ in range(2)]
    assert objects == [["x"], ["x"]]


def test_split_between_processes_on_one_process():
    accelerator = Accelerator(cpu=True)
    with accelerator.split_between_processes(["a", "b", "c"]) as piece:
        assert piece == ["a", "b", "c"]
    with accelerator.split_between_processes({"x": [1, 2], "y": torch.arange(3)}) as piece:
        assert piece["x"] == [1, 2] and torch.equal(piece["y"], torch.arange(3))


def test_split_arithmetic_for_several_processes():
    from trainer.runtime.state import _split

    pieces = [_split(["a", "b", "c"], 2, rank, False) for rank in range(2)]
    assert pieces == [["a", "b"], ["c"]]
    padded = [_split(["a", "b", "c"], 2, rank, True) for rank in range(2)]
    assert padded == [["a", "b"], ["c", "c"]]
    assert torch.equal(_split(torch.arange(5), 2, 1, True), torch.tensor([3, 4, 4]))


def test_main_process_first_and_print(capsys):
    accelerator = Accelerator(cpu=True)
    with accelerator.main_process_first():
        accelerator.print("hello", 1)
    with accelerator.local_main_process_first():
        pass
    accelerator.wait_for_everyone()
    assert capsys.readouterr().out == "hello 1\n"
    assert accelerator.on_main_process(lambda: 7)() == 7


def test_autocast_and_mixed_precision_forward():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    # forward patched with autocast; its outputs returned as float32, as Accelerate's
    with accelerator.autocast():
        assert model.forward.original(torch.randn(2, 4)).dtype == torch.bfloat16
    assert model(torch.randn(2, 4)).dtype == torch.float32
    assert model.weight.dtype == torch.float32
    with accelerator.autocast():
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.bfloat16
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.randn(2, 4)).dtype == torch.float32
    assert isinstance(Accelerator(cpu=True).autocast(), contextlib.AbstractContextManager)


def test_clip_grad_value_and_norm():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    accelerator.backward(model(torch.full((1, 4), 100.0)).sum())
    norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
    assert norm > 1.0
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert total <= 1.0 + 1e-5
    accelerator.clip_grad_value_(model.parameters(), 0.1)
    assert max(p.grad.abs().max() for p in model.parameters()) <= 0.1


def test_clip_grad_value_leaves_parameters_without_gradients():
    """After a skipped step no parameter has a gradient; torch's clip_grad_value_ raises on
    that (an empty list), the Accelerator clips nothing. A single tensor is accepted too."""
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    accelerator.clip_grad_value_(model.parameters(), 0.1)  # no gradient anywhere
    assert all(p.grad is None for p in model.parameters())
    accelerator.backward(model(torch.full((1, 4), 100.0)).sum())
    accelerator.clip_grad_value_(model.weight, 0.1)
    assert model.weight.grad.abs().max() <= 0.1 and model.bias.grad.abs().max() == 1.0


def test_dynamo_backend_compiles_and_unwrap_returns_the_module():
    accelerator = Accelerator(cpu=True, dynamo_backend="aot_eager")
    model = torch.nn.Linear(4, 1)
    compiled = accelerator.prepare(model)
    assert compiled is not model and accelerator.unwrap_model(compiled) is model
    torch.testing.assert_close(compiled(torch.ones(1, 4)), model(torch.ones(1, 4)))


def test_unwrap_model_keep_torch_compile_returns_the_compiled_wrapper():
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    model = torch.nn.Linear(4, 1)
    compiled = accelerator.prepare(model)
    assert accelerator.unwrap_model(compiled, keep_torch_compile=True) is compiled
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model
    assert accelerator.unwrap_model(model, keep_torch_compile=True) is model  # nothing compiled


def test_prepare_optimizer_keeps_state_on_its_parameters_device():
    """State loaded before prepare stays usable (on CPU: untouched); device_placement=False too."""
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    moments = optimizer.state[model.weight]["exp_avg"]
    model, optimizer = accelerator.prepare(model, optimizer, device_placement=[True, False])
    assert optimizer.optimizer.state[model.weight]["exp_avg"] is moments
    again = accelerator.prepare_optimizer(
        torch.optim.SGD(model.parameters()), device_placement=True
    )
    assert isinstance(again, AcceleratedOptimizer)


def test_skip_first_batches_on_prepared_and_plain_loaders():
    accelerator = Accelerator(cpu=True)
    plain = DataLoader(list(range(10)), batch_size=2)
    assert [b.tolist() for b in accelerator.skip_first_batches(plain, 3)] == [[6, 7], [8, 9]]
    prepared = accelerator.prepare(DataLoader(list(range(10)), batch_size=2))
    skipped = trainer.skip_first_batches(prepared, 4)
    assert [b.tolist() for b in skipped] == [[8, 9]]
    # Every pass skips, as Accelerate's (the second pass yielded the whole epoch before).
    assert [b.tolist() for b in skipped] == [[8, 9]] and len(skipped) == 1


def test_trackers_write_csv(tmp_path):
    accelerator = Accelerator(cpu=True, log_with="csv", project_dir=str(tmp_path))
    accelerator.init_trackers("proj", config={"lr": 0.1})
    accelerator.log({"loss": torch.tensor(0.5)}, step=3)
    assert accelerator.get_tracker("csv") is accelerator.trackers[0]
    accelerator.end_training()
    text = (tmp_path / "proj" / "version_0" / "metrics.csv").read_text().splitlines()
    assert text[0].split(",") == ["loss", "step"] and text[1] == "0.5,3"
    assert "lr: 0.1" in (tmp_path / "proj" / "version_0" / "hparams.yaml").read_text()
    with pytest.raises(trainer.ConfigurationError, match="log_with='nonsense'"):
        Accelerator(log_with="nonsense").init_trackers("p")


def test_find_executable_batch_size_retries_on_oom():
    tried = []

    @trainer.find_executable_batch_size(starting_batch_size=64)
    def run(batch_size):
        tried.append(batch_size)
        if batch_size > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return batch_size

    assert run() == 8 and tried == [
        64,
        57,
        51,
        45,
        40,
        36,
        32,
        28,
        25,
        22,
        19,
        17,
        15,
        13,
        11,
        9,
        8,
    ]
    tried.clear()
    assert run() == 8 and tried == [8]  # the next call starts from the size that worked

    @trainer.find_executable_batch_size(starting_batch_size=4)
    def never(batch_size):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    with pytest.raises(trainer.ConfigurationError, match="down to batch size 1"):
        never()

    @trainer.find_executable_batch_size(starting_batch_size=4)
    def other(batch_size):
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        other()


def test_seed_everything_reproduces_draws():
    trainer.seed_everything(7)
    first = (torch.rand(3), __import__("random").random())
    trainer.seed_everything(7)
    second = (torch.rand(3), __import__("random").random())
    assert torch.equal(first[0], second[0]) and first[1] == second[1]
    trainer.synchronize_rng_states(["torch"])  # one process: a no-op that must not fail


def test_save_replaces_a_file_atomically_and_names_a_path_it_cannot_write(tmp_path):
    # Accelerate's accelerator.save is torch.save on the main process; here a failure half-way
    # keeps the previous file whole and leaves no temporary file behind.
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    accelerator = Accelerator(cpu=True)
    path = tmp_path / "state.pt"
    accelerator.save({"w": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        accelerator.save({"w": torch.zeros(3), "bad": Unpicklable()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]
    with pytest.raises(trainer.CheckpointError, match="missing"):
        accelerator.save({"w": torch.ones(1)}, tmp_path / "missing" / "state.pt")


def test_accelerator_state_has_this_accelerators_settings():
    # accelerator.state was the bare PartialState: state.mixed_precision and
    # state.deepspeed_plugin (which ported scripts read) raised AttributeError.
    bf16, plain = Accelerator(cpu=True, mixed_precision="bf16"), Accelerator(cpu=True)
    assert (bf16.state.mixed_precision, plain.state.mixed_precision) == ("bf16", "no")
    assert bf16.state.deepspeed_plugin is None and bf16.state.is_fsdp2 is False
    assert bf16.state.distributed_type == trainer.DistributedType.NO
    assert isinstance(bf16.state, trainer.PartialState)
    assert (bf16.state.num_processes, bf16.state.is_main_process) == (1, True)


def test_an_unknown_tracker_name_is_refused_when_the_accelerator_is_built(tmp_path):
    """As Accelerate's ValueError in ``Accelerator(...)``, before any run or file exists."""
    with pytest.raises(trainer.ConfigurationError, match="log_with='nonsense'") as caught:
        Accelerator(cpu=True, log_with=["csv", "nonsense"], project_dir=str(tmp_path))
    assert isinstance(caught.value, ValueError)
    assert list(tmp_path.iterdir()) == []
    built = Accelerator(cpu=True, log_with=[trainer.LoggerType.CSV, "all"])
    assert built.log_with == [trainer.LoggerType.CSV, "all"]
