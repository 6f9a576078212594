"""Collective and process-control scenarios: what each call returns on this process.

One scenario per call. The collectives run twice: as Accelerator methods
(``ops/<verb>_method/<case>``) and as the free functions of ``accelerate.utils`` or trainer's
mirror (``ops/<verb>_function/<case>``). Inputs depend on the rank, so a wrong source, order or
reduction shows in the values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tests.accelerate_parity.kit import Side, jsonable, scenario, scratch

Call = Callable[[Callable[..., Any]], Any]  # receives the verb (method or function), calls it


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def _ranked(length: int = 3) -> torch.Tensor:
    """``[0, 1, 2] + 10 * rank``: every process sends something different."""
    return torch.arange(length, dtype=torch.float32) + 10 * _rank()


def _register(verb: str, calls: dict[str, Call], *, accelerate_has_method: bool = True) -> None:
    """Register ``ops/<verb>_method/<case>`` and ``ops/<verb>_function/<case>`` for each case.

    Where Accelerate's Accelerator has no such method, its free function is the expected value
    of trainer's method.
    """
    for case, call in calls.items():

        def as_function(side: Side, call: Call = call) -> Any:
            side.accelerator()  # both frameworks' functions read the process state it sets up
            return jsonable(call(side.function(verb)))

        def as_method(side: Side, call: Call = call) -> Any:
            accelerator = side.accelerator()
            if side.name == "accelerate" and not accelerate_has_method:
                return jsonable(call(side.function(verb)))
            return jsonable(call(getattr(accelerator, verb)))

        scenario(f"ops/{verb}_function/{case}")(as_function)
        scenario(f"ops/{verb}_method/{case}")(as_method)


_register("gather", {
    "vector": lambda gather: gather(_ranked()),
    "scalar": lambda gather: gather(torch.tensor(_rank() + 0.5)),
    "matrix": lambda gather: gather(_ranked(4).reshape(2, 2)),
    "int64": lambda gather: gather(torch.arange(2) + 100 * _rank()),
    "nested": lambda gather: gather({"a": _ranked(2), "b": (torch.tensor([_rank()]), [_ranked(1)])}),
})  # fmt: skip
_register("reduce", {
    "default": lambda reduce: reduce(_ranked() + 1),
    "sum": lambda reduce: reduce(_ranked() + 1, "sum"),
    "mean": lambda reduce: reduce(_ranked() + 1, "mean"),
    "max": lambda reduce: reduce(_ranked() + 1, "max"),
    "min": lambda reduce: reduce(_ranked() + 1, "min"),
    "sum_scale_2": lambda reduce: reduce(_ranked() + 1, "sum", 2.0),
    "mean_nested": lambda reduce: reduce({"a": _ranked(), "b": [_ranked(2)]}, "mean"),
    "sum_int64": lambda reduce: reduce(torch.arange(3) + _rank(), "sum"),
    "none": lambda reduce: reduce(_ranked() + 1, "none"),
})  # fmt: skip
_register("pad_across_processes", {
    "dim0": lambda pad: pad(torch.arange(_rank() + 2, dtype=torch.float32)),
    "dim1_pad_index": lambda pad: pad(torch.ones(2, _rank() + 1), dim=1, pad_index=-1),
    "pad_first": lambda pad: pad(torch.arange(_rank() + 2, dtype=torch.float32), pad_first=True),
    "nested": lambda pad: pad({"a": torch.arange(_rank() + 2), "b": [torch.ones(_rank() + 1, 2)]}),
    "same_size": lambda pad: pad(torch.ones(3)),
})  # fmt: skip
_register("broadcast", {
    "default": lambda broadcast: broadcast(_ranked()),
    "nested": lambda broadcast: broadcast({"a": _ranked(), "b": [torch.tensor([_rank()])]}),
    "from_last": lambda broadcast: broadcast(_ranked(), from_process=_world() - 1),
}, accelerate_has_method=False)  # fmt: skip
_register("wait_for_everyone", {"call": lambda wait: wait()})


def _raises_type_error(call: Call) -> Call:
    """What a collective does with Python numbers (``loss.item()``): a TypeError on both sides
    (trainer's `NotATensorError` is one), or the value it returned."""

    def run(verb: Callable[..., Any]) -> Any:
        try:
            return {"returned": jsonable(call(verb))}
        except TypeError:
            return "TypeError"

    return run


_register("reduce", {
    f"python_{name}": _raises_type_error(call) for name, call in {
        "float": lambda reduce: reduce(float(_rank() + 1), "mean"),
        "dict": lambda reduce: reduce({"loss": float(_rank() + 1)}, "sum"),
        "mixed_list": lambda reduce: reduce([_ranked(), 1.0], "sum"),
    }.items()
})  # fmt: skip
_register("gather", {
    f"python_{name}": _raises_type_error(call) for name, call in {
        "float": lambda gather: gather(float(_rank() + 1)),
        "list": lambda gather: gather([float(_rank() + 1)]),
    }.items()
})  # fmt: skip
_register("broadcast", {
    "python_float": _raises_type_error(lambda broadcast: broadcast(float(_rank() + 1))),
}, accelerate_has_method=False)  # fmt: skip

for _case, _make in {
    "list": lambda: [_rank(), f"r{_rank()}"],
    "nested_list": lambda: [{"rank": _rank()}, (_rank(), _rank())],
    "tensor_list": lambda: [torch.tensor([_rank()])],
    "dict": lambda: {"rank": _rank()},
    "string": lambda: f"r{_rank()}",
}.items():

    def _gather_object(side: Side, make: Callable[[], Any] = _make) -> Any:
        side.accelerator()
        return jsonable(side.function("gather_object")(make()))

    scenario(f"ops/gather_object/{_case}")(_gather_object)


for _case, _make in {
    "from_first": lambda: ([_rank(), {"r": _rank()}], 0),
    "from_last": lambda: ([_rank(), f"r{_rank()}"], _world() - 1),
}.items():

    def _broadcast_object_list(side: Side, make: Callable[[], Any] = _make) -> Any:
        side.accelerator()
        objects, source = make()
        return jsonable(side.function("broadcast_object_list")(objects, from_process=source))

    scenario(f"ops/broadcast_object_list/{_case}")(_broadcast_object_list)


@scenario("ops/pad_then_gather/method")
def _pad_then_gather(side: Side) -> Any:
    """Ragged tensors made gatherable: Accelerate's recipe for variable-length predictions."""
    accelerator = side.accelerator()
    return jsonable(accelerator.gather(accelerator.pad_across_processes(torch.arange(_rank() + 2))))


# ---- split_between_processes ------------------------------------------------------------------
SPLIT_INPUTS: dict[str, tuple[Callable[[], Any], bool]] = {
    "list_3": (lambda: list(range(3)), False),
    "list_4": (lambda: list(range(4)), False),
    "list_17": (lambda: list(range(17)), False),
    "list_3_padded": (lambda: list(range(3)), True),
    "list_4_padded": (lambda: list(range(4)), True),
    "tuple_5": (lambda: tuple("abcde"), False),
    "strings_2": (lambda: ["a", "b"], False),
    "tensor_2x4": (lambda: torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]), False),
    "tensor_3x1": (lambda: torch.arange(3).reshape(3, 1), False),
    "tensor_3x1_padded": (lambda: torch.arange(3).reshape(3, 1), True),
    "tensor_4_padded": (lambda: torch.arange(4), True),
    "dict": (
        lambda: {"a": list(range(1, 9)), "b": list("abcdefgh"), "c": torch.arange(1, 9)},
        False,
    ),
    "dict_padded": (lambda: {"a": list(range(5)), "c": torch.arange(5)}, True),
    "one_item": (lambda: [42], False),
    "one_item_padded": (lambda: [42], True),
}


def _split_case(make: Callable[[], Any], apply_padding: bool) -> Callable[[Side], Any]:
    def run(side: Side) -> Any:
        accelerator = side.accelerator()
        with accelerator.split_between_processes(make(), apply_padding=apply_padding) as part:
            return jsonable(part)

    return run


for _name, (_make, _padding) in SPLIT_INPUTS.items():
    scenario(f"split_between_processes/{_name}")(_split_case(_make, _padding))


@scenario("split_between_processes/partial_state")
def _split_partial_state(side: Side) -> Any:
    side.accelerator()
    state = side.attr("PartialState")()
    with state.split_between_processes(list(range(5)), apply_padding=True) as part:
        return jsonable(part)


# ---- running code on some processes ---------------------------------------------------------
def _mark(tag: str) -> Callable[[], str]:
    return lambda: tag


DECORATORS: dict[str, Callable[[Any], Any]] = {
    "on_main_process": lambda acc: acc.on_main_process(_mark("main"))(),
    "on_local_main_process": lambda acc: acc.on_local_main_process(_mark("local"))(),
    "on_last_process": lambda acc: acc.on_last_process(_mark("last"))(),
    "on_process": lambda acc: acc.on_process(_mark("p"), process_index=acc.num_processes - 1)(),
    "on_process_factory": lambda acc: acc.on_process(process_index=0)(_mark("p0"))(),
    "on_local_process": lambda acc: acc.on_local_process(_mark("l0"), local_process_index=0)(),
}
for _name, _call in DECORATORS.items():
    scenario(f"process/decorator/{_name}")(lambda side, call=_call: call(side.accelerator()))


@scenario("process/trigger")
def _trigger(side: Side) -> list[Any]:
    """Accelerate's ``test_trigger``: one process sets it, every process sees it once."""
    accelerator = side.accelerator()
    seen = [accelerator.check_trigger()]
    if accelerator.is_main_process:
        accelerator.set_trigger()
    seen += [accelerator.check_trigger(), accelerator.check_trigger()]
    if accelerator.is_last_process:
        accelerator.set_trigger()
    seen.append(accelerator.check_trigger())
    return seen


@scenario("process/main_process_first")
def _main_process_first(side: Side) -> dict[str, list[str]]:
    """Per block, the order in which the processes entered it (a file they share)."""
    accelerator = side.accelerator()
    blocks = {"main": accelerator.main_process_first, "local": accelerator.local_main_process_first}
    for name, block in blocks.items():
        with block(), open(scratch() / name, "a", encoding="utf-8") as file:
            file.write(f"{accelerator.process_index}\n")
    accelerator.wait_for_everyone()
    return {name: (scratch() / name).read_text(encoding="utf-8").split() for name in blocks}


# ---- accelerator.save, and the loader settings read off the Accelerator ----------------------
@scenario("process/save")
def _save(side: Side) -> dict[str, Any]:
    """``accelerator.save`` (pickle and safetensors) writes once, from the main process: every
    process reads back the main process's tensors."""
    from safetensors.torch import load_file

    accelerator = side.accelerator()
    mine = {"w": _ranked(), "step": torch.tensor(7 + _rank())}
    accelerator.save(mine, scratch() / "state.pt")
    accelerator.save(mine, scratch() / "state.safetensors", safe_serialization=True)
    accelerator.wait_for_everyone()
    return {
        "pickle": jsonable(torch.load(scratch() / "state.pt", weights_only=True)),
        "safetensors": jsonable(load_file(scratch() / "state.safetensors")),
        "files": sorted(path.name for path in scratch().iterdir()),
    }


@scenario("process/loader_settings")
def _loader_settings(side: Side) -> dict[str, Any]:
    config = side.loader_config(even_batches=False, non_blocking=True, use_seedable_sampler=True)
    accelerator = side.accelerator(dataloader_config=config)
    names = ["split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler"]
    names += ["non_blocking", "use_stateful_dataloader"]
    return {name: getattr(accelerator, name) for name in names} | {"scaler": accelerator.scaler}
