"""Process-wide facts: which process this is, how many there are, and the enums that name modes.

`PartialState` is the only shared state in `trainer` (DESIGN §4): every instance reads
the same process facts. Everything configurable (precision, accumulation, strategy) belongs to
each Accelerator instead, so two Accelerators with different settings can live in one process.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["AcceleratorState", "DistributedType", "LoggerType", "PartialState", "PrecisionType"]


class _StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return self.value


class DistributedType(_StrEnum):
    """How processes and devices are organised; the members of Accelerate's enum."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(_StrEnum):
    """Accelerate's ``mixed_precision`` names."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class LoggerType(_StrEnum):
    """Tracker names accepted by ``Accelerator(log_with=...)``."""

    ALL = "all"
    CSV = "csv"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class PartialState:
    """Facts about the current process, shared by every instance.

    Reads an initialised ``torch.distributed`` process group if there is one, else the launcher's
    environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), else one process.

    Examples:
        >>> state = PartialState()
        >>> state.num_processes, state.process_index
        (1, 0)
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, cpu: bool = False) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state.get("initialized") or self._is_stale():
            self._read_environment(cpu)

    def _is_stale(self) -> bool:
        # A process group started (or ended) since we last looked changes every fact.
        return self._shared_state.get("saw_process_group") != _process_group_is_up()

    def _read_environment(self, cpu: bool) -> None:
        if _process_group_is_up():
            world_size = torch.distributed.get_world_size()
            rank = torch.distributed.get_rank()
            backend: str | None = torch.distributed.get_backend()
        else:
            world_size, rank, backend = 1, 0, None
        self.num_processes = world_size
        self.process_index = rank
        self.local_process_index = _env_int("LOCAL_RANK", 0) if world_size > 1 else 0
        self.backend = backend
        self.device = default_device(cpu, self.local_process_index)
        if world_size == 1:
            self.distributed_type = DistributedType.NO
        elif self.device.type == "cuda":
            self.distributed_type = DistributedType.MULTI_GPU
        else:
            self.distributed_type = DistributedType.MULTI_CPU
        self.saw_process_group = _process_group_is_up()
        self.initialized = True

    @classmethod
    def reset_state(cls) -> None:
        """Forget the cached facts: the next ``PartialState()`` reads them again.

        Strategies call it after starting or ending a process group; tests between runs.
        """
        cls._shared_state.clear()

    _reset_state = reset_state  # Accelerate's (private) name, for code ported from it

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op with one process)."""
        if self.num_processes > 1:
            torch.distributed.barrier()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's main process first, then on the others."""
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(
        self, inputs: Sequence[Any] | dict[str, Any] | torch.Tensor, apply_padding: bool = False
    ) -> Iterator[Any]:
        """Give each process its contiguous slice of ``inputs``.

        With 2 processes and ``["a", "b", "c"]``, process 0 gets ``["a", "b"]`` and process 1
        ``["c"]`` (or ``["c", "c"]`` with ``apply_padding=True``). Dicts are split value by value.
        """
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"PartialState(distributed_type={self.distributed_type}, "
            f"num_processes={self.num_processes}, process_index={self.process_index}, "
            f"local_process_index={self.local_process_index}, device={self.device})"
        )


class AcceleratorState(PartialState):
    """``accelerator.state``: the process facts of `PartialState` plus this Accelerator's own
    settings under Accelerate's names (``mixed_precision``, ``distributed_type``,
    ``deepspeed_plugin``, ``fsdp_plugin``, ``dynamo_plugin``, ``is_fsdp2``).

    Unlike Accelerate's process-wide singleton, each Accelerator has its own: the settings are
    read from the Accelerator that owns it, the process facts from the shared `PartialState`.

    Examples:
        >>> from trainer import Accelerator
        >>> state = Accelerator(cpu=True, mixed_precision="bf16").state
        >>> state.mixed_precision, state.num_processes, state.deepspeed_plugin
        ('bf16', 1, None)
    """

    def __init__(self, accelerator: Any, cpu: bool = False) -> None:  # no shared __dict__
        PartialState(cpu=cpu)  # read (or refresh) the process facts
        self._accelerator = accelerator

    def __getattr__(self, name: str) -> Any:  # a process fact: num_processes, device, ...
        return getattr(PartialState(), name)

    # The owning Accelerator's settings (class properties win over the shared process facts).
    mixed_precision = property(lambda self: self._accelerator.mixed_precision)
    distributed_type = property(lambda self: self._accelerator.distributed_type)
    deepspeed_plugin = property(lambda self: self._accelerator.deepspeed_plugin)
    fsdp_plugin = property(lambda self: self._accelerator.fsdp_plugin)
    dynamo_plugin = property(lambda self: self._accelerator.dynamo_plugin)
    is_fsdp2 = property(lambda self: self._accelerator.is_fsdp2)

    debug = False  # Accelerate's ACCELERATE_DEBUG_MODE: no extra checks here


def _process_group_is_up() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def default_device(cpu: bool, local_rank: int) -> torch.device:
    """This process's device: its CUDA device by local rank, else MPS, else (or ``cpu``) the CPU."""
    if not cpu and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if not cpu and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _split(inputs: Any, num: int, index: int, apply_padding: bool) -> Any:
    if isinstance(inputs, dict):
        return {k: _split(v, num, index, apply_padding) for k, v in inputs.items()}
    length = len(inputs)
    per_process, extra = divmod(length, num)
    start = index * per_process + min(index, extra)
    end = start + per_process + (1 if index < extra else 0)
    piece = inputs[start:end]
    if apply_padding and extra and index >= extra and length:
        last = inputs[-1:]
        piece = torch.cat([piece, last]) if isinstance(piece, torch.Tensor) else piece + last
    return piece
