"""API scenarios: ``load_state``'s options, ``unwrap_model`` of a compiled model, the n-D
parallelism facts — what a ported script passes or reads, beside the training scenarios."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from tests.accelerate_parity.kit import Side, model, parameters, scenario, scratch


# ---- load_state's options, unwrap_model of a compiled model ----------------------------------
@scenario("resume/load_state_strict_false")
def _load_state_strict_false(side: Side) -> dict[str, Any]:
    """A model grown by a layer after the save: a strict load is refused, ``strict=False``
    (with ``map_location`` and ``load_kwargs`` as ported scripts pass them) loads the layers
    the checkpoint has and leaves the new one as it was."""
    accelerator = side.accelerator()
    net = accelerator.prepare(model())
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(1.0)
    directory = str(scratch() / "saved")
    accelerator.save_state(directory)
    accelerator.wait_for_everyone()
    facts: dict[str, Any] = {"saved": parameters(accelerator.unwrap_model(net))}
    grown = side.accelerator()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        head = torch.nn.Linear(1, 1)
    bigger = grown.prepare(torch.nn.Sequential(*model(), head))
    facts["before"] = parameters(grown.unwrap_model(bigger))
    try:
        grown.load_state(directory)
        facts["strict"] = "loaded"
    except Exception:  # Accelerate: torch's RuntimeError; trainer: CheckpointError
        facts["strict"] = "refused"
    facts["unchanged_after_refusal"] = parameters(grown.unwrap_model(bigger)) == facts["before"]
    grown.load_state(
        directory, strict=False, map_location="cpu", load_kwargs={"weights_only": True}
    )
    facts["after"] = parameters(grown.unwrap_model(bigger))
    return facts


def _reset_accelerate_state(side: Side) -> None:
    """Accelerate's first Accelerator of a process fixes its options (dynamo backend,
    parallelism config) for every later one: reset them before and after a scenario that
    sets its own, so the other scenarios keep plain Accelerators."""
    if side.name == "accelerate":
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state()


def own_accelerate_state(function: Callable[[Side], Any]) -> Callable[[Side], Any]:
    """``function`` with Accelerate's process-wide state reset around it."""

    @functools.wraps(function)
    def run(side: Side) -> Any:
        _reset_accelerate_state(side)
        try:
            return function(side)
        finally:
            _reset_accelerate_state(side)

    return run


def _compiling(side: Side) -> Any:
    """An Accelerator with ``dynamo_backend="eager"``."""
    return side.accelerator(dynamo_backend="eager")


@scenario("unwrap/keep_torch_compile")
@own_accelerate_state
def _unwrap_compiled(side: Side) -> dict[str, Any]:
    """``dynamo_backend``: what ``unwrap_model`` returns with ``keep_torch_compile`` given."""
    accelerator = _compiling(side)
    net = accelerator.prepare(model())
    unwrapped = accelerator.unwrap_model(net, keep_torch_compile=False)
    facts: dict[str, Any] = {
        "prepared": type(net).__name__,
        "unwrapped": [type(unwrapped).__name__, list(unwrapped.state_dict())],
    }
    if accelerator.num_processes == 1:  # no engine between: the compiled wrapper is returned
        kept = accelerator.unwrap_model(net, keep_torch_compile=True)
        facts["kept"] = [type(kept).__name__, list(kept.state_dict()), kept is net]
    return facts


@scenario("unwrap/compiled_default")
@own_accelerate_state
def _unwrap_compiled_default(side: Side) -> dict[str, Any]:
    """A deliberate difference: ``unwrap_model(model)`` of a compiled model (Accelerate keeps
    the compiled wrapper; trainer returns the module), and ``keep_torch_compile=True`` with DDP
    between (Accelerate re-points the wrapper at the module; trainer refuses)."""
    accelerator = _compiling(side)
    net = accelerator.prepare(model())
    facts: dict[str, Any] = {"default": type(accelerator.unwrap_model(net)).__name__}
    try:
        kept = accelerator.unwrap_model(net, keep_torch_compile=True)
        facts["kept"] = [type(kept).__name__, list(kept.state_dict())]
    except Exception as error:
        facts["kept"] = type(error).__name__
    return facts


@scenario("parallelism/rank_facts")
@own_accelerate_state
def _parallelism_facts(side: Side) -> dict[str, Any]:
    """Accelerate's n-D parallelism facts with and without a ``ParallelismConfig`` (one process:
    Accelerate 1.15 refuses a config on several CPU processes; the 2-process ranks are checked
    against the mesh in tests/distributed/test_parallelism.py)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return {"skipped": "one process only"}
    facts: dict[str, Any] = {}
    names = ("data_parallel_rank", "data_parallel_shard_rank", "tensor_parallel_rank")
    for label, options in (("none", {}), ("config", {"parallelism_config": True})):
        _reset_accelerate_state(side)
        if options:
            options = {"parallelism_config": side.attr("ParallelismConfig")()}
        accelerator = side.accelerator(**options)
        seen: dict[str, Any] = {"mesh": accelerator.torch_device_mesh is None}
        for name in (*names, "should_save_model", "is_composable_parallelism_enabled"):
            try:
                seen[name] = getattr(accelerator, name)
            except Exception:  # Accelerate: RuntimeError; trainer: ConfigurationError
                seen[name] = "refused"
        try:
            seen["pipeline_parallel_rank"] = accelerator.pipeline_parallel_rank
        except NotImplementedError:
            seen["pipeline_parallel_rank"] = "NotImplementedError"
        facts[label] = seen
    return facts


# ---- find_executable_batch_size ------------------------------------------------------------------
@scenario("memory/find_executable_batch_size")
def _find_executable_batch_size(side: Side) -> dict[str, Any]:
    """The sizes tried after out-of-memory errors (default reduction, a no-argument
    ``reduce_batch_size_fn``), where a second call starts, and a caller passing the size."""
    find = side.function("find_executable_batch_size")
    tried: list[int] = []

    def fits_up_to(limit: int) -> Callable[[int], int]:
        def train(batch_size: int) -> int:
            tried.append(batch_size)
            if batch_size > limit:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return batch_size

        return train

    facts: dict[str, Any] = {}
    default = find(fits_up_to(16), starting_batch_size=64)
    facts["default"] = [default(), list(tried)]
    tried.clear()
    facts["second_call"] = [default(), list(tried)]  # starts from the size that worked
    tried.clear()
    sizes = iter([40, 20, 10])
    halving = find(fits_up_to(16), starting_batch_size=64, reduce_batch_size_fn=lambda: next(sizes))
    facts["reduce_fn"] = [halving(), list(tried)]

    def with_model(batch_size: int, model_name: str) -> str:
        return f"{batch_size}:{model_name}"

    decorated = find(with_model, starting_batch_size=8)
    facts["passes_size"] = decorated("net")
    try:
        decorated(8, "net")
        facts["size_given_by_caller"] = "ran"
    except TypeError:  # Accelerate's; trainer's ConfigurationError is one too
        facts["size_given_by_caller"] = "TypeError"
    return facts


# ---- accelerator.state ------------------------------------------------------------------------
@scenario("state/accelerator_state")
def _accelerator_state(side: Side) -> dict[str, Any]:
    """What ported scripts read from ``accelerator.state`` (``mixed_precision``,
    ``deepspeed_plugin is not None`` to pick a DeepSpeed path, the process facts)."""
    state = side.accelerator().state
    return {
        "mixed_precision": str(state.mixed_precision),
        "distributed_type": state.distributed_type.value,
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "is_main_process": state.is_main_process,
        "deepspeed_plugin": state.deepspeed_plugin,
        "is_fsdp2": state.is_fsdp2,
        "device": state.device.type,  # Accelerate's multi-process CPU device is "cpu:0"
    }


# ---- set_seed and get_logger: the two utilities nearly every ported script imports ---------------
@scenario("utilities/set_seed")
def _set_seed(side: Side) -> dict[str, Any]:
    import random

    import numpy as np

    set_seed = side.function("set_seed")
    side.accelerator()  # Accelerate's device_specific reads the state an Accelerator sets up

    def draws() -> list[float]:
        return [random.random(), float(np.random.rand()), float(torch.rand(1))]

    set_seed(42)
    same = draws()
    set_seed(42, device_specific=True)  # + the process index: each process draws its own
    return {"same": same, "device_specific": draws()}


@scenario("utilities/get_logger")
def _get_logger(side: Side) -> list[str]:
    import logging

    if side.name == "accelerate":
        from accelerate.logging import get_logger
    else:
        get_logger = side.function("get_logger")
    side.accelerator()  # Accelerate's needs its state initialised first
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # where the record says it was made: this function, at the line of the call
            line = record.lineno - _get_logger.__code__.co_firstlineno
            records.append(f"{record.levelname} {record.getMessage()} {record.funcName}:{line}")

    name = f"parity.{side.name}"
    logging.getLogger(name).addHandler(Keep())
    logger = get_logger(name, log_level="INFO")
    logger.info("main only")
    logger.warning("everywhere", main_process_only=False)
    logger.debug("below the level", main_process_only=False)
    logger.info("in order", in_order=True)
    logger.log(logging.WARNING, "by level", main_process_only=False)
    return records


# ---- prepare called again on what it returned ------------------------------------------------------
@scenario("prepare/twice")
def _prepare_twice(side: Side) -> dict[str, Any]:
    """A script that prepares its model again (a helper calling ``prepare`` on what it got):
    the same objects come back, and ``save_state`` holds one model, so a run that prepares once
    loads it."""
    accelerator = side.accelerator()
    net = model()
    net, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    again, optimizer_again = accelerator.prepare(net, optimizer)
    directory = str(scratch() / "twice")
    accelerator.save_state(directory)
    accelerator.wait_for_everyone()
    fresh = side.accelerator()
    fresh_net = model()
    fresh.prepare(fresh_net, torch.optim.SGD(fresh_net.parameters(), lr=0.1))
    try:
        fresh.load_state(directory)
        loaded = "loaded"
    except Exception as err:  # trainer: CheckpointError (2 models saved, 1 prepared)
        loaded = type(err).__name__
    return {"same": [again is net, optimizer_again is optimizer], "load": loaded}


# ---- get_tracker: Accelerate's tracker verbs, on every process ------------------------------------
@scenario("trackers/get_tracker_verbs")
def _get_tracker_verbs(side: Side) -> dict[str, Any]:
    """A script calling ``accelerator.get_tracker("tensorboard").log(...)`` on every process:
    the main process's tracker logs, the others get one whose calls do nothing, and so does an
    Accelerator with no trackers started."""
    accelerator = side.accelerator(log_with="tensorboard", project_dir=str(scratch() / "tb"))
    accelerator.init_trackers("parity")
    facts: dict[str, Any] = {}
    try:
        tracker = accelerator.get_tracker("tensorboard")
        tracker.store_init_configuration({"lr": 0.1})
        tracker.log({"loss": 0.5, "acc": torch.tensor(0.25)}, step=1)
        facts["verbs"] = "ran"
        facts["backend"] = tracker.tracker is not None
    except Exception as err:
        facts["verbs"] = type(err).__name__
    try:
        side.accelerator().get_tracker("tensorboard").log({"loss": 1.0}, step=0)
        facts["without_trackers"] = "ran"
    except Exception as err:
        facts["without_trackers"] = type(err).__name__
    accelerator.get_tracker("tensorboard").finish()  # not end_training: Accelerate's ends the group
    return facts


# ---- accelerate.utils helpers a script imports: send_to_device, extract_model_from_parallel ------
class _Pair(NamedTuple):
    features: torch.Tensor
    label: str


class _Movable:
    """A user's batch type whose ``.to`` takes the device only (no ``non_blocking``)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def to(self, device: Any) -> _Movable:
        return _Movable(self.tensor.to(device))


def _placement(value: Any) -> Any:
    """The structure of ``value`` with each tensor as ``"tensor@<device>"``."""
    if isinstance(value, torch.Tensor):
        return f"tensor@{value.device.type}"
    if isinstance(value, _Movable):
        return {"_Movable": _placement(value.tensor)}
    if isinstance(value, tuple | list):
        return {type(value).__name__: [_placement(v) for v in value]}
    if isinstance(value, dict):
        return {type(value).__name__: {k: _placement(v) for k, v in value.items()}}
    return value


@scenario("utilities/send_to_device")
def _send_to_device(side: Side) -> dict[str, Any]:
    """``send_to_device`` of a nested batch (to the meta device, so a move shows on a CPU
    machine): named tuples, lists, dicts, ``skip_keys`` as one key and as a list, an object
    with its own ``.to``, and values that are not tensors."""
    send = side.function("send_to_device")
    batch = {
        "pair": _Pair(torch.ones(2), "label"),
        "list": [torch.zeros(1), 3, None],
        "keep": torch.ones(1),
        "also": {"keep": torch.ones(1), "inner": (torch.ones(1),)},
        "movable": _Movable(torch.ones(1)),
    }
    return {
        "all": _placement(send(batch, "meta")),
        "skip_one": _placement(send(batch, torch.device("meta"), skip_keys="keep")),
        "skip_list": _placement(send(batch, "meta", non_blocking=True, skip_keys=["keep", "x"])),
        "tensor": _placement(send(torch.ones(1), "meta")),
    }


@scenario("unwrap/extract_model_from_parallel")
@own_accelerate_state
def _extract_model_from_parallel(side: Side) -> dict[str, Any]:
    """``extract_model_from_parallel`` of a model prepared in bf16 (DDP on 2 processes): the
    user's own module comes back, and its forward autocasts until ``keep_fp32_wrapper=False``."""
    extract = side.function("extract_model_from_parallel")
    accelerator = side.accelerator(mixed_precision="bf16")
    net = model()
    seen: list[bool] = []
    net[0].register_forward_pre_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    prepared = accelerator.prepare(net)
    extracted = extract(prepared)
    output = extracted(torch.ones(2, 4))
    bare = extract(prepared, keep_fp32_wrapper=False)
    bare_output = bare(torch.ones(2, 4))
    return {
        "extracted": [type(extracted).__name__, extracted is net, bare is net],
        "autocast": seen,
        "dtypes": [str(output.dtype), str(bare_output.dtype)],
    }


@scenario("utilities/patch_environment_and_release_memory")
def _patch_environment_and_release_memory(side: Side) -> dict[str, Any]:
    """``patch_environment`` (names upper-cased, values as strings, everything put back) and
    ``release_memory`` (one None per object, to rebind them)."""
    os.environ["PARITY_KEPT"] = "before"
    os.environ.pop("PARITY_ADDED", None)
    with side.function("patch_environment")(parity_kept=1, parity_added=2.5):
        inside = [os.environ.get("PARITY_KEPT"), os.environ.get("PARITY_ADDED")]
    after = [os.environ.get("PARITY_KEPT"), os.environ.get("PARITY_ADDED")]
    net, optimizer = model(), None
    net, optimizer = side.function("release_memory")(net, optimizer)
    return {"inside": inside, "after": after, "released": [net, optimizer]}
