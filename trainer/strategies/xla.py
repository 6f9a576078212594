"""XLAStrategy: data parallelism on XLA devices (TPU; also PJRT's CPU and CUDA) with torch_xla.

What it owns: the PJRT runtime's device for this replica (``torch_xla.device()``), the replica
facts (``torch_xla.runtime``), gradient reduction (what ``xm.optimizer_step`` does:
``reduce_gradients``, then the step) followed by ``xm.mark_step()``, which cuts the lazy graph
once per optimizer step, collectives over ``xm`` ops, moving checkpoints to the CPU before the
global master writes them (the job ``xm.save`` does for a single file), ``MpDeviceLoader`` for
dataloaders, and the optional SPMD mode (``xr.use_spmd()``, a device mesh, batches sharded on
their first dimension). Replicas are started by ``XLAStrategy.spawn`` (``xmp.spawn``) or by
torchrun, which joins the ``xla://`` process group.

What it does not own: which samples each replica reads (the Accelerator's data sharding, from
``distributed_sampler_kwargs``), dtypes (the Precision plugin), the checkpoint format
(``trainer.checkpoint``). Every torch_xla import is lazy, through ``require(..., extra="xla")``:
importing this module does not need torch_xla.
"""

from __future__ import annotations

import collections
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import torch

from trainer._imports import is_available, require
from trainer.errors import ConfigurationError, MissingDependencyError, StrategyError, describe
from trainer.precision import Precision
from trainer.runtime.state import DistributedType
from trainer.strategies.strategy import ReduceOp, Strategy
from trainer.utilities import rank_zero_only

__all__ = ["XLA_ACCELERATORS", "XLAStrategy"]

# accelerator argument -> PJRT_DEVICE (None: leave it to PJRT_DEVICE / torch_xla's default)
XLA_ACCELERATORS: dict[str | None, str | None] = {
    None: None,
    "auto": None,
    "xla": None,
    "tpu": "TPU",
    "cpu": "CPU",
    "cuda": "CUDA",
    "gpu": "CUDA",
    "neuron": "NEURON",
}
_OPS = ("mean", "sum", "max", "min")


class XLAStrategy(Strategy):
    """One replica per XLA device; gradients averaged over replicas before clipping and stepping.

    Args:
        accelerator: the PJRT device type: "tpu", "cpu", "cuda"/"gpu", "neuron"; None, "auto"
            or "xla" leave it to the ``PJRT_DEVICE`` environment variable (torch_xla's default
            when unset: a TPU if there is one).
        precision: the Precision plugin (the Accelerator fills it in when None).
        sync_module_states: broadcast the master replica's parameters and buffers to the
            others in `setup_module` (``xm.broadcast_master_param``), so every replica
            starts equal whatever its seed.
        spmd: run one process per host in torch_xla's SPMD mode: ``xr.use_spmd()``, a device
            mesh, batches from `process_dataloader` sharded along the mesh's first axis;
            the compiler inserts the collectives, so gradients are not reduced by hand.
        mesh_shape: the SPMD mesh's shape (default: every device on one axis); the first
            axis shards the batch. Only with ``spmd=True``.
        mesh_axis_names: the mesh's axis names (default ``("data",)``). Only with ``spmd=True``.

    Raises:
        ConfigurationError: for an unknown accelerator, one that contradicts ``PJRT_DEVICE``,
            or mesh arguments without ``spmd=True``.
        MissingDependencyError: from `setup_environment` when torch_xla is missing or
            does not import beside this torch (its wheels match one torch release each).

    Examples:
        >>> trainer = Trainer(strategy=XLAStrategy("tpu"), precision="bf16-mixed", max_epochs=3)
        >>> XLAStrategy.spawn(train)  # one process per TPU chip, each calls train(index)
    """

    name = "xla"
    distributed_type = DistributedType.XLA

    forward_needs_all_processes = True  # every replica runs the compiled graph in step

    def __init__(
        self,
        accelerator: str | None = None,
        *,
        precision: Precision | None = None,
        sync_module_states: bool = True,
        spmd: bool = False,
        mesh_shape: tuple[int, ...] | None = None,
        mesh_axis_names: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(None, precision=precision)
        self.pjrt_device = _check_accelerator(accelerator)
        if not spmd and (mesh_shape is not None or mesh_axis_names is not None):
            raise ConfigurationError(
                f"XLAStrategy(mesh_shape={mesh_shape!r}, mesh_axis_names={mesh_axis_names!r}): "
                "a device mesh is used only in SPMD mode. Pass spmd=True, or drop the mesh."
            )
        if mesh_shape is not None and mesh_axis_names is not None:
            if len(mesh_shape) != len(mesh_axis_names):
                raise ConfigurationError(
                    f"XLAStrategy(mesh_shape={mesh_shape!r}, mesh_axis_names="
                    f"{mesh_axis_names!r}): give one axis name per mesh dimension."
                )
        self.sync_module_states = sync_module_states
        self.spmd = spmd
        self.mesh_shape = mesh_shape
        self.mesh_axis_names = mesh_axis_names
        self.mesh: Any = None  # the torch_xla.distributed.spmd.Mesh, once set up (SPMD only)
        self._reduced: set[int] = set()  # ids of parameters whose gradient is averaged already

    # ---- facts -------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """This replica's XLA device (``torch_xla.device()``; in SPMD the one virtual device)."""
        if self._device is None:
            self._device = _xla_device()
        return self._device

    @property
    def world_size(self) -> int:
        """Replicas that each read their own data: devices, or in SPMD, processes."""
        runtime = _runtime()
        return runtime.process_count() if self.spmd else runtime.world_size()

    @property
    def global_rank(self) -> int:
        runtime = _runtime()
        return runtime.process_index() if self.spmd else runtime.global_ordinal()

    @property
    def local_rank(self) -> int:
        if self.spmd:
            return int(os.environ.get("LOCAL_RANK", "0"))
        return _runtime().local_ordinal()

    @property
    def node_rank(self) -> int:
        return _runtime().host_index()

    # ---- setup -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Start the PJRT runtime: device type, SPMD, the ``xla://`` group under torchrun."""
        runtime = _runtime()
        if self.pjrt_device is not None:
            runtime.set_device_type(self.pjrt_device)
        if self.spmd:
            runtime.use_spmd()
        if torch.distributed.is_torchelastic_launched() and not torch.distributed.is_initialized():
            _import("torch_xla.distributed.xla_backend")  # registers the "xla" backend
            torch.distributed.init_process_group("xla", init_method="xla://")
        self._device = _xla_device()
        if self.spmd:
            self.mesh = self._build_mesh()
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]  # as DDPStrategy
        self.precision.setup(self._device)

    def _build_mesh(self) -> Any:
        """The SPMD mesh over every device of the job; its first axis shards the batch."""
        import numpy as np  # a torch_xla dependency

        spmd = _import("torch_xla.distributed.spmd")
        count = _runtime().global_runtime_device_count()
        shape = self.mesh_shape or (count,)
        names = self.mesh_axis_names or (("data",) if len(shape) == 1 else None)
        if int(np.prod(shape)) != count:
            raise ConfigurationError(
                f"XLAStrategy(mesh_shape={shape!r}): the mesh must hold all {count} devices "
                f"(the product of mesh_shape is {int(np.prod(shape))}). Choose a shape whose "
                "product is the device count."
            )
        return spmd.Mesh(np.arange(count), shape, names)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert dtypes, move to the XLA device, start every replica from the master's values."""
        module = self.precision.convert_module(module).to(self.root_device)
        if self.sync_module_states and self.world_size > 1 and not self.spmd:
            _xm().broadcast_master_param(module)
        return module

    def process_dataloader(self, dataloader: Iterable[Any]) -> Iterable[Any]:
        """Feed batches to the device in the background (``MpDeviceLoader``), one graph per batch.

        In SPMD mode each tensor of a batch is instead sharded along the mesh's first axis.
        """
        if self.spmd:
            return _ShardedLoader(dataloader, self.root_device, self.mesh)
        loader_module = _import("torch_xla.distributed.parallel_loader")
        return loader_module.MpDeviceLoader(dataloader, self.root_device)

    # ---- training ----------------------------------------------------------------------
    def clip_grad_norm_(
        self,
        module: torch.nn.Module | None,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Average the gradients over replicas first: every replica must clip the same norm."""
        parameters = list(parameters)
        self._reduce_gradients(parameters)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``xm.optimizer_step`` with the precision plugin's step inside, then ``xm.mark_step``.

        ``xm.optimizer_step`` is ``xm.reduce_gradients`` followed by ``optimizer.step()``; here
        the step is the plugin's, so a 16-mixed GradScaler can still skip it.
        """
        self._reduce_gradients([p for group in optimizer.param_groups for p in group["params"]])
        stepped = self.precision.optimizer_step(optimizer)
        self._reduced.clear()
        _xm().mark_step()
        return stepped

    def _reduce_gradients(self, parameters: list[torch.Tensor]) -> None:
        """Average the gradients not averaged yet this step (``xm.reduce_gradients``'s op)."""
        if self.spmd or self.world_size == 1:
            return  # SPMD: the compiler reduces; one replica: nothing to reduce
        gradients = [
            p.grad for p in parameters if p.grad is not None and id(p) not in self._reduced
        ]
        if gradients:
            xm = _xm()
            xm.all_reduce(xm.REDUCE_SUM, gradients, scale=1.0 / self.world_size)
        self._reduced.update(id(p) for p in parameters)

    # ---- collectives -------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        if op not in _OPS:
            raise StrategyError(f"all_reduce(op={op!r}): expected one of {list(_OPS)}.")
        if self.world_size == 1:
            return tensor
        xm = _xm()
        value = tensor.to(self.root_device)
        if op == "mean" and not value.is_floating_point():
            value = value.float()
        kind = {"mean": xm.REDUCE_SUM, "sum": xm.REDUCE_SUM}.get(op)
        kind = kind or (xm.REDUCE_MAX if op == "max" else xm.REDUCE_MIN)
        result = xm.all_reduce(kind, value)
        if op == "mean":
            result = result / self.world_size
        return result.to(tensor.device)

    def all_gather(
        self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> torch.Tensor:
        """Lightning's signature; ``group`` must be None (XLA gathers over every process) and
        ``sync_grads`` uses torch_xla's differentiable gather."""
        if group is not None:
            raise StrategyError(
                "XLAStrategy.all_gather(group=...): XLA gathers over every process; pass "
                "group=None."
            )
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        sent = tensor.to(self.root_device).unsqueeze(0)
        if sync_grads:
            gathered = _import("torch_xla.core.functions").all_gather(sent, dim=0)
        else:
            gathered = _xm().all_gather(sent, dim=0)
        return gathered.to(tensor.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        if isinstance(obj, torch.Tensor):
            value = obj.to(self.root_device).clone()
            _xm().collective_broadcast([value], root_ordinal=src)
            return value.to(obj.device)
        return self.all_gather_object(obj)[src]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        payloads = _xm().rendezvous("trainer.all_gather_object", pickle.dumps(_to_cpu(obj)))
        return [pickle.loads(payload) for payload in payloads]

    def barrier(self, name: str | None = None) -> None:
        if self.world_size > 1:
            _xm().rendezvous(name or "trainer.barrier")

    # ---- state -------------------------------------------------------------------------
    # The global master writes the whole state with the base writer (no shards), so
    # AsyncCheckpointIO writes it in the background: `prepare_state_copy`, then its host copy.
    has_sharded_checkpoints = False

    def save_checkpoint(self, path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
        """Run the pending graph, move every XLA tensor to the CPU, write on the global master."""
        self.prepare_state_copy()
        super().save_checkpoint(path, _to_cpu(checkpoint))

    def prepare_state_copy(self) -> None:
        """Run the pending graph (``xm.mark_step``), so the host copy reads computed values."""
        _xm().mark_step()

    @staticmethod
    def spawn(function: Callable[..., Any], *args: Any, start_method: str = "spawn") -> None:
        """Run ``function(index, *args)`` once per device with ``xmp.spawn`` (PJRT).

        Under torchrun there is nothing to spawn: call the function directly instead; the
        strategy joins the ``xla://`` process group in `setup_environment`.

        Examples:
            >>> def train(index: int) -> None:
            ...     Trainer(strategy="xla", max_epochs=1).fit(MyModule(), loader)
            >>> XLAStrategy.spawn(train)  # a v4-8 TPU: 4 processes, index 0..3
        """
        xmp = _import("torch_xla.distributed.xla_multiprocessing")
        xmp.spawn(function, args=args, start_method=start_method)

    def __repr__(self) -> str:
        device = self._device if self._device is not None else self.pjrt_device or "PJRT_DEVICE"
        return f"XLAStrategy(device={device}, spmd={self.spmd}, precision={self.precision.name!r})"


class _ShardedLoader:
    """SPMD: each batch on the device, its tensors sharded along the mesh's first axis."""

    def __init__(self, loader: Iterable[Any], device: torch.device, mesh: Any) -> None:
        self.loader = loader
        self.device = device
        self.mesh = mesh

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # only asked of sized loaders

    def __iter__(self) -> Iterator[Any]:
        spmd = _import("torch_xla.distributed.spmd")
        axis = self.mesh.axis_names[0] if self.mesh.axis_names else 0
        size = self.mesh.mesh_shape[0]

        def place(value: torch.Tensor) -> torch.Tensor:
            value = value.to(self.device)
            if value.dim() >= 1 and value.shape[0] % size == 0:
                spmd.mark_sharding(value, self.mesh, (axis,) + (None,) * (value.dim() - 1))
            return value

        for batch in self.loader:
            yield _map_tensors(batch, place)
            _xm().mark_step()


def _check_accelerator(accelerator: str | None) -> str | None:
    """The PJRT_DEVICE ``accelerator`` asks for, checked against the environment."""
    key = accelerator.lower() if isinstance(accelerator, str) else accelerator
    if key not in XLA_ACCELERATORS:
        valid = ", ".join(repr(name) for name in XLA_ACCELERATORS if name is not None)
        raise ConfigurationError(
            f"XLAStrategy(accelerator={describe(accelerator)}): expected one of {valid} or None."
        )
    wanted = XLA_ACCELERATORS[key]
    current = os.environ.get("PJRT_DEVICE")
    if wanted is not None and current not in (None, "", wanted):
        raise ConfigurationError(
            f"XLAStrategy(accelerator={accelerator!r}) asks for PJRT_DEVICE={wanted}, but the "
            f"environment sets PJRT_DEVICE={current}. Unset PJRT_DEVICE, or pass "
            "accelerator=None to use it."
        )
    return wanted


def _import(module: str) -> ModuleType:
    """Import a torch_xla module, explaining a torch_xla that is installed but does not load."""
    try:
        return require(module, extra="xla", feature="XLAStrategy")
    except MissingDependencyError as err:
        if not is_available("torch_xla"):
            raise
        raise MissingDependencyError(
            f"XLAStrategy: torch_xla is installed but does not import beside torch "
            f"{torch.__version__} ({err.__cause__}). Each torch_xla wheel needs the torch "
            "release of the same number: install a matching pair, e.g. "
            "pip install 'torch==2.9.0' 'torch_xla==2.9.0' (see .ci/xla)."
        ) from err


def _runtime() -> ModuleType:
    return _import("torch_xla.runtime")


def _xm() -> ModuleType:
    return _import("torch_xla.core.xla_model")


def _xla_device() -> torch.device:
    """``torch_xla.device()`` (torch_xla >= 2.5), else the older ``xm.xla_device()``."""
    torch_xla = _import("torch_xla")
    if hasattr(torch_xla, "device"):
        return torch_xla.device()
    return _xm().xla_device()


def _to_cpu(value: Any) -> Any:
    """A copy of a nest of containers with every XLA tensor on the CPU (what ``xm.save`` does)."""
    return _map_tensors(value, lambda t: t.cpu() if t.device.type == "xla" else t)


def _map_tensors(value: Any, function: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``function`` applied to each tensor in its dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, dict):
        items = [(key, _map_tensors(item, function)) for key, item in value.items()]
        return (
            collections.OrderedDict(items)
            if isinstance(value, collections.OrderedDict)
            else dict(items)
        )
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_map_tensors(item, function) for item in value))
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(item, function) for item in value)
    return value
