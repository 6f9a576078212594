"""``prepare_pippy``: pipeline-parallel inference on ``torch.distributed.pipelining``.

Owns splitting a model into one stage per process (at named modules, or balanced by parameter
size with ``split_points="auto"``), the GPipe schedule that runs micro-batches through the
stages, padding a short batch to the traced shape, and bringing the output to every process.

Does not own the process group (the launcher's, joined through ``DDPStrategy``) nor the
tracing and point-to-point transfers (torch). ``torch.distributed.pipelining`` is imported
on the first call, so ``import trainer`` stays cheap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainer.big_modeling.device_map import compute_module_sizes
from trainer.data.transfer import send_to_device
from trainer.errors import ConfigurationError, describe
from trainer.runtime.state import PartialState
from trainer.strategies.environment import detect_environment

__all__ = ["prepare_pippy"]


def prepare_pippy(
    model: torch.nn.Module,
    split_points: str | list[str] | None = "auto",
    no_split_module_classes: list[str] | None = None,
    example_args: tuple[Any, ...] = (),
    example_kwargs: dict[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool = False,
) -> torch.nn.Module:
    """Split ``model`` into one pipeline stage per process for inference (Accelerate's API).

    Process ``i`` keeps stage ``i``. Every process then calls ``model(*inputs)`` with the same
    inputs: the first stage splits the batch into ``num_chunks`` micro-batches along dim 0 and
    feeds them through the stages (GPipe); the last process returns the output, the others
    ``None`` unless ``gather_output``. A batch smaller than the example's is padded (its last
    row repeated) and the output trimmed; a batch of another shape re-traces the model.

    Args:
        model: the model, in evaluation mode; its forward must be traceable by ``torch.export``.
        split_points: the names of the modules that begin stages 2, 3, ... (one fewer than the
            processes), or "auto" (or None): contiguous blocks of about equal parameter size.
        no_split_module_classes: class names "auto" never splits inside (e.g. ``["Block"]``).
        example_args: inputs of one call, on the CPU, batch along dim 0 (traced per micro-batch).
        example_kwargs: keyword inputs of one call (the same keys at every call).
        num_chunks: micro-batches per call; None is the number of processes.
        gather_output: send the last stage's output to every process.

    Returns:
        ``model``, whose ``forward`` now runs the pipeline (``model._original_forward`` keeps
        the old one, ``model.pippy_stage`` the schedule, ``model.hf_split_points`` the split).

    Raises:
        ConfigurationError: no example inputs, split points that do not name one module per
            later stage, ``num_chunks`` < 1, or an example batch smaller than ``num_chunks``.

    Examples:
        >>> # torchrun --nproc_per_node 2: layers 0-1 on process 0, 2-3 on process 1
        >>> model = prepare_pippy(net, split_points=["2"], example_args=(torch.randn(4, 8),))
        >>> output = model(torch.randn(4, 8))  # a (4, ...) tensor on process 1, None on 0
    """
    state = _join_process_group()
    num_chunks = num_chunks if num_chunks is not None else state.num_processes
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
        raise ConfigurationError(
            f"prepare_pippy(num_chunks={describe(num_chunks)}): expected an int >= 1, e.g. "
            f"num_chunks={state.num_processes} (one micro-batch per process)."
        )
    example_args = send_to_device(tuple(example_args), torch.device("cpu"))
    example_kwargs = send_to_device(dict(example_kwargs or {}), torch.device("cpu"))
    if split_points in ("auto", None):
        split_points = balanced_split_points(model, state.num_processes, no_split_module_classes)
    names = [split_points] if isinstance(split_points, str) else list(split_points)
    _check_split_points(model, names, state.num_processes)
    runner = _PipelineRunner(model, names, num_chunks, state, gather_output)
    runner.build(example_args, example_kwargs)
    model._original_forward = model.forward  # type: ignore[assignment]  # noqa: SLF001 - Accelerate's name
    model.forward = runner  # type: ignore[method-assign]
    model.pippy_stage = runner.schedule  # type: ignore[assignment]
    model.hf_split_points = names  # type: ignore[assignment]
    return model


def balanced_split_points(
    model: torch.nn.Module, num_stages: int, no_split_module_classes: Sequence[str] | None = None
) -> list[str]:
    """Modules that begin stages 2..n, cutting the model into blocks of about equal size.

    Blocks are the top-level children, opened up (unless their class is in
    ``no_split_module_classes``) while one is larger than a stage's share.

    Examples:
        >>> net = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
        >>> balanced_split_points(net, 2)
        ['2']
    """
    sizes = compute_module_sizes(model, None)
    share = sizes[""] / max(1, num_stages)
    keep_whole = set(no_split_module_classes or ())
    blocks = [(name, child) for name, child in model.named_children()]
    while True:
        too_big = [
            i
            for i, (name, child) in enumerate(blocks)
            if sizes.get(name, 0) > share
            and type(child).__name__ not in keep_whole
            and next(child.children(), None) is not None
        ]
        if not too_big:
            break
        index = too_big[0]
        name, child = blocks[index]
        blocks[index : index + 1] = [(f"{name}.{sub}", mod) for sub, mod in child.named_children()]
    points, total = [], 0
    for name, _ in blocks:
        if total >= share * (len(points) + 1) and len(points) < num_stages - 1:
            points.append(name)
        total += sizes.get(name, 0)
    if len(points) < num_stages - 1:
        raise ConfigurationError(
            f"prepare_pippy(split_points='auto'): {type(model).__name__} has {len(blocks)} "
            f"blocks, too few to cut into {num_stages} stages of similar size. Pass split_points"
            " naming the modules that begin each later stage."
        )
    return points


def _join_process_group() -> PartialState:
    """The launcher's group, joined if nothing joined it yet (Accelerate's PartialState does)."""
    if not dist.is_initialized() and detect_environment().is_distributed:
        from trainer.strategies.ddp import DDPStrategy

        DDPStrategy().setup_environment()
    return PartialState()


def _check_split_points(model: torch.nn.Module, names: list[str], num_stages: int) -> None:
    modules = dict(model.named_modules())
    unknown = [name for name in names if name not in modules or name == ""]
    if unknown or len(names) != num_stages - 1:
        raise ConfigurationError(
            f"prepare_pippy(split_points={names!r}): expected {num_stages - 1} module name(s) of "
            f"{type(model).__name__} (one per stage after the first, for {num_stages} "
            f"processes){'; unknown: ' + repr(unknown) if unknown else ''}. Use names from "
            "model.named_modules(), or split_points='auto'."
        )


class _PipelineRunner:
    """The pipelined forward: pads the batch, runs the schedule, trims and gathers the output."""

    def __init__(
        self,
        model: torch.nn.Module,
        split_points: list[str],
        num_chunks: int,
        state: PartialState,
        gather_output: bool,
    ) -> None:
        self.model, self.split_points, self.num_chunks = model, split_points, num_chunks
        self.state, self.gather_output = state, gather_output
        self.schedule: Any = None
        self.batch_size = 0
        self.shapes: list[tuple[int, ...]] = []

    def build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Trace the model on one micro-batch of ``args`` / ``kwargs`` and build this stage."""
        from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

        batch = _batch_size(args, kwargs)
        if batch is None or batch < self.num_chunks:
            raise ConfigurationError(
                f"prepare_pippy: the inputs need a tensor whose dim 0 (the batch) has at least "
                f"num_chunks={self.num_chunks} rows (received batch {batch}). Pass "
                "example_args=(a batch as used at inference,)."
            )
        micro = -(-batch // self.num_chunks)
        self.batch_size, self.shapes = micro * self.num_chunks, _shapes(args, kwargs)
        if self.state.num_processes == 1:
            return  # one process is one stage: the model's own forward
        args, kwargs = _pad(args, self.batch_size), _pad(kwargs, self.batch_size)
        split_spec = {name: SplitPoint.BEGINNING for name in self.split_points}
        first_args = tuple(_first_chunk(a, micro) for a in args)
        first_kwargs = {k: _first_chunk(v, micro) for k, v in kwargs.items()}
        with _class_forward(self.model, self.split_points), torch.no_grad():
            pipe = pipeline(self.model, first_args, first_kwargs, split_spec=split_spec)
        stage = pipe.build_stage(self.state.process_index, device=self.state.device)
        self.schedule = ScheduleGPipe(stage, self.num_chunks)
        self.model.pippy_stage = self.schedule  # type: ignore[assignment]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.state.num_processes == 1:
            return self.model._original_forward(*args, **kwargs)  # noqa: SLF001 - set above
        batch = _batch_size(args, kwargs)
        if batch is None or batch > self.batch_size or _shapes(args, kwargs)[1:] != self.shapes[1:]:
            self.build(args, kwargs)  # every process sees the same inputs, so all rebuild
        args, kwargs = _pad(args, self.batch_size), _pad(kwargs, self.batch_size)
        device = self.state.device
        with torch.no_grad():
            if self.state.process_index == 0:  # the first stage feeds the micro-batches
                output = self.schedule.step(
                    *send_to_device(args, device), **send_to_device(kwargs, device)
                )
            else:
                output = self.schedule.step()
        if self.state.is_last_process:
            output = _trim(output, batch or self.batch_size)
        if self.gather_output:
            holder = [output]
            dist.broadcast_object_list(holder, src=self.state.num_processes - 1)
            output = send_to_device(holder[0], self.state.device)
        return output if self.state.is_last_process or self.gather_output else None


@contextlib.contextmanager
def _class_forward(model: torch.nn.Module, split_points: list[str]) -> Iterator[None]:
    """Trace the class's forward, and leave no split marks behind for the next trace.

    ``pipeline`` marks each split module by replacing its ``forward`` in place; a second trace
    over those marks would wrap them again. The pipelined forward an earlier build installed on
    ``model`` is put aside too.
    """
    modules = [model, *(model.get_submodule(name) for name in split_points)]
    saved = [
        {k: m.__dict__[k] for k in ("forward", "_orig_forward") if k in m.__dict__} for m in modules
    ]
    model.__dict__.pop("forward", None)
    try:
        yield
    finally:
        for module, attributes in zip(modules, saved):
            module.__dict__.pop("forward", None)
            module.__dict__.pop("_orig_forward", None)
            module.__dict__.update(attributes)


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    values = list(args) + list(kwargs.values())
    return [v for v in values if isinstance(v, torch.Tensor)]


def _batch_size(args: Any, kwargs: Any) -> int | None:
    tensors = [t for t in _tensors(args, kwargs) if t.dim() > 0]
    return int(tensors[0].shape[0]) if tensors else None


def _shapes(args: Any, kwargs: Any) -> list[tuple[int, ...]]:
    """Dim 0 of the first tensor, then every tensor's other dims (what the trace fixed)."""
    tensors = [t for t in _tensors(args, kwargs) if t.dim() > 0]
    return [(int(tensors[0].shape[0]),)] + [tuple(t.shape[1:]) for t in tensors] if tensors else []


def _pad(values: Any, batch_size: int) -> Any:
    """Repeat the last row of each batched tensor up to ``batch_size`` rows."""

    def pad(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] >= batch_size:
            return value
        extra = value[-1:].expand(batch_size - value.shape[0], *value.shape[1:])
        return torch.cat([value, extra])

    if isinstance(values, dict):
        return {key: pad(value) for key, value in values.items()}
    return tuple(pad(value) for value in values)


def _first_chunk(value: Any, micro: int) -> Any:
    return value[:micro] if isinstance(value, torch.Tensor) and value.dim() > 0 else value


def _trim(output: Any, batch_size: int) -> Any:
    """The first ``batch_size`` rows of every tensor in ``output`` (padding removed)."""
    if isinstance(output, torch.Tensor):
        return output[:batch_size] if output.dim() > 0 else output
    if isinstance(output, dict):
        return type(output)({key: _trim(value, batch_size) for key, value in output.items()})
    if isinstance(output, list | tuple):
        return type(output)(_trim(value, batch_size) for value in output)
    return output
