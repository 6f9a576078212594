"""TrainModule (the model plus its step logic) and DataModule (the data, with its loaders).

A user subclasses TrainModule and writes ``training_step`` and ``configure_optimizers``; the
Trainer calls everything else. This module owns the user-facing surface only: the loop that
calls it lives in ``trainer/trainer/trainer.py``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Self

import torch

from trainer.accelerator.collectives import map_tensors, number_as_tensor
from trainer.errors import ConfigurationError
from trainer.trainer.data_hooks import DataHooks
from trainer.trainer.datamodule import DataModule  # its own file; this path stays
from trainer.trainer.hyperparameters import AttributeDict, HyperparameterMixin
from trainer.trainer.mode_hooks import ModeHooks
from trainer.trainer.module_export import ExportMixin
from trainer.trainer.module_hooks import ModuleHooks
from trainer.trainer.module_loading import load_module, restricted_classmethod

if TYPE_CHECKING:
    from trainer.accelerator.optimizer import AcceleratedOptimizer
    from trainer.callbacks.callback import Callback
    from trainer.loggers.logger import Logger
    from trainer.trainer.metrics import MetricStore
    from trainer.trainer.trainer import Trainer

__all__ = ["AttributeDict", "DataModule", "TrainModule"]


class TrainModule(
    HyperparameterMixin, ExportMixin, ModuleHooks, ModeHooks, DataHooks, torch.nn.Module
):
    """A ``torch.nn.Module`` with its training logic.

    Required: ``training_step(batch, batch_idx)`` returning the loss (a Tensor, a dict with
    "loss", or None to skip the batch) and ``configure_optimizers()``. Optional: the other
    ``*_step`` methods, ``configure_model`` and the ``*_dataloader`` methods, and any hook of
    `trainer.callbacks.Callback` (without its ``trainer, module`` arguments).

    Examples:
        >>> class Regressor(TrainModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         loss = torch.nn.functional.mse_loss(self.net(x), y)
        ...         self.log("train/loss", loss, prog_bar=True)
        ...         return loss
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    """

    # No class annotations at run time: torch.jit.script reads them for the attributes a
    # subclass sets (self.automatic_optimization = False) and cannot parse these strings.
    if TYPE_CHECKING:
        automatic_optimization: bool
        prepare_data_per_node: bool
        example_input_array: Any
        strict_loading: bool
    # Properties TorchScript must not compile (to_torchscript, torch.jit.script on the module).
    __jit_unused_properties__ = [
        *("current_epoch", "device", "device_mesh", "dtype", "global_rank", "global_step"),
        *("hparams", "hparams_initial", "local_rank", "logger", "loggers", "metric_store"),
        *("on_gpu", "trainer", "world_size"),
    ]
    automatic_optimization = True
    prepare_data_per_node = True  # False: prepare_data on global rank zero only
    # Lightning's: an input for `forward`, traced by TensorBoardLogger(log_graph=True) at fit start
    example_input_array = None
    # Lightning's `strict_loading`: whether checkpoint weights must match this module's exactly
    # (resuming with ckpt_path, load_from_checkpoint with strict=None). Set False for a module
    # whose checkpoints leave out frozen weights.
    strict_loading = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._metric_store: MetricStore | None = None
        # requires_grad of the parameters `toggle_optimizer` froze, until `untoggle_optimizer`
        self._toggled: dict[torch.Tensor, bool] = {}

    # ---- read-only context ----------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module."""
        if self._trainer is None and not self._jit_is_scripting:  # to_torchscript reads it
            raise ConfigurationError(
                f"{type(self).__name__}.trainer: the module is not attached to a Trainer. Call "
                "trainer.fit(module) (or validate/test/predict) first."
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        """Attach the module to ``trainer`` (the Trainer does, at the start of each call)."""
        self._trainer = trainer

    @property
    def metric_store(self) -> MetricStore | None:
        """Where ``self.log`` records: the running stage's store, set by the Trainer as the
        stages change (None outside a Trainer run)."""
        return self._metric_store

    @metric_store.setter
    def metric_store(self, store: MetricStore | None) -> None:
        self._metric_store = store

    @property
    def device(self) -> torch.device:
        """The device the module computes on."""
        if self._trainer is not None:
            return self._trainer.accelerator.device
        param = next(self.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def world_size(self) -> int:
        return self._trainer.world_size if self._trainer is not None else 1

    @property
    def on_gpu(self) -> bool:
        """Whether the module computes on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's floating-point parameters (bfloat16 under ``"bf16-true"``);
        torch's default dtype when it has none."""
        param = next((p for p in self.parameters() if p.is_floating_point()), None)
        return param.dtype if param is not None else torch.get_default_dtype()

    @property
    def logger(self) -> Logger | None:
        """The Trainer's first logger (``self.logger.experiment`` is the backend's own object),
        or None."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Logger]:
        """The Trainer's loggers ([] outside a Trainer)."""
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def device_mesh(self) -> Any:
        """The strategy's device mesh (model-parallel strategies), else None."""
        return (
            getattr(self._trainer.strategy, "device_mesh", None)
            if self._trainer is not None
            else None
        )

    # ---- user hooks with defaults ----------------------------------------------------------
    def prepare_data(self) -> None:
        """Download or preprocess once per machine (local rank zero; global rank zero only with
        ``prepare_data_per_node = False``) before ``setup``; every process waits for it."""

    def configure_model(self) -> None:
        """Build large layers here (called once, after the strategy is set up)."""

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """``trainer.predict``'s step; by default the module's ``forward`` on the whole batch.

        Called as ``predict_step(batch, batch_idx)``, with ``dataloader_idx`` too when
        ``predict`` has several dataloaders (Lightning's default, so ``self(batch)``).
        """
        batch = kwargs.get("batch", args[0] if args else None)
        return self(batch)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one learning-rate scheduler; the Trainer calls it for every scheduler it steps.

        Override it to step a scheduler your own way (Lightning's hook). ``metric`` is the
        ``monitor`` value for ``ReduceLROnPlateau``, else None.
        """
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step the optimizer on each batch that steps (automatic optimization; Lightning's hook).

        ``optimizer_closure`` runs the batch's ``training_step``, ``zero_grad`` and backward;
        ``optimizer.step(closure=optimizer_closure)`` runs it, then ``on_before_optimizer_step``
        and gradient clipping, then steps. Override it to act around the step, and call the
        closure in any case (``optimizer_closure()`` alone trains without stepping). Not called
        while gradients accumulate, nor under manual optimization.

        Args:
            epoch: the current epoch.
            batch_idx: the index of the batch inside the epoch.
            optimizer: the prepared optimizer (``self.optimizers()``).
            optimizer_closure: the batch's training closure.

        Examples:
            >>> def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            ...     scale = min(1.0, (self.trainer.global_step + 1) / 500)  # warm-up
            ...     for group in optimizer.param_groups:
            ...         group["lr"] = scale * 1e-3
            ...     optimizer.step(closure=optimizer_closure)
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Clear the gradients on the first batch of each accumulation window (automatic
        optimization; Lightning's hook), after ``training_step``, before backward.

        Args:
            epoch: the current epoch.
            batch_idx: the index of the batch inside the epoch.
            optimizer: the torch optimizer (not the prepared one, whose ``zero_grad`` does
                nothing inside an accumulation window).
        """
        optimizer.zero_grad()

    # ---- logging --------------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        reduce_fx: str | Callable[..., Any] = "mean",
        sync_dist: bool = False,
        batch_size: int | None = None,
        add_dataloader_idx: bool = True,
        rank_zero_only: bool = False,
        sync_dist_group: Any = None,
        metric_attribute: str | None = None,
        enable_graph: bool = False,
    ) -> None:
        """Record a metric.

        Defaults: in ``training_step`` ``on_step=True, on_epoch=False``; in validation/test and
        in ``*_epoch_end`` hooks ``on_step=False, on_epoch=True``, where the epoch value is the
        batch-size-weighted mean (``reduce_fx`` "sum", "max", "min" also work). ``value`` is a
        number, a scalar Tensor (kept on the device until a logger writes) or a torchmetrics
        Metric (computed, synced and reset at epoch end). Logged with both ``on_step`` and
        ``on_epoch`` it appears as ``name_step`` and ``name_epoch``. With several validation /
        test dataloaders a name logged in a step or batch hook gets the suffix
        ``/dataloader_idx_N`` (unless ``add_dataloader_idx=False``), as in Lightning.

        Lightning's other keywords: ``rank_zero_only=True`` (logged from one process only) skips
        the ``sync_dist`` reduction, so it cannot hang; ``metric_attribute`` is accepted (the
        Metric object itself is what is logged here); ``sync_dist_group`` and
        ``enable_graph=True`` are refused (`ConfigurationError`): values are reduced over all
        processes and logged detached.
        """
        if sync_dist_group is not None or enable_graph:
            raise ConfigurationError(
                f"{type(self).__name__}.log({name!r}, sync_dist_group=..., enable_graph=True): not "
                "supported; values are reduced over every process (sync_dist=True) and logged "
                "detached from the graph. Reduce over a subgroup yourself and log the result."
            )
        store = self._metric_store
        if store is None:
            raise ConfigurationError(
                f"{type(self).__name__}.log({name!r}): self.log works inside the hooks and steps "
                "a Trainer calls; this call came from outside a Trainer run."
            )
        store.log(
            name,
            value,
            on_step=on_step,
            on_epoch=on_epoch,
            prog_bar=prog_bar,
            logger=logger,
            reduce_fx=reduce_fx,
            sync_dist=sync_dist and not rank_zero_only,
            batch_size=batch_size,
            add_dataloader_idx=add_dataloader_idx,
        )

    def log_dict(self, metrics: Mapping[str, Any], **kwargs: Any) -> None:
        """``self.log`` for each item of ``metrics``, with the same options."""
        for name, value in metrics.items():
            self.log(name, value, **kwargs)

    # ---- manual optimization --------------------------------------------------------------
    def optimizers(
        self, use_pl_optimizer: bool = True
    ) -> AcceleratedOptimizer | list[AcceleratedOptimizer] | Any:
        """The prepared optimizer (or list of them) from ``configure_optimizers``; the torch
        optimizers themselves with ``use_pl_optimizer=False`` (Lightning's argument)."""
        optimizers = self.trainer.optimizers
        if not use_pl_optimizer:
            optimizers = [getattr(o, "optimizer", o) for o in optimizers]
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def lr_schedulers(self) -> Any:
        """The scheduler (or list of them) from ``configure_optimizers``, or None."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (scaled, synced and hooked like the automatic path)."""
        self.trainer.manual_backward(loss, **kwargs)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Freeze the parameters that only other optimizers update, so that this one's backward
        computes no gradient for them (manual optimization with several optimizers, e.g. a GAN);
        `untoggle_optimizer` puts their ``requires_grad`` back."""
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for other in self.trainer.optimizers:
            for group in other.param_groups:
                for param in group["params"]:
                    if id(param) not in own and param not in self._toggled:
                        self._toggled[param] = param.requires_grad
                        param.requires_grad = False

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give back the ``requires_grad`` that `toggle_optimizer` took."""
        for param, requires_grad in self._toggled.items():
            param.requires_grad = requires_grad
        self._toggled.clear()

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """`toggle_optimizer` for the block, `untoggle_optimizer` after it."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's hook: run the backward pass of ``loss`` (already divided for gradient
        accumulation and scaled under ``16-mixed``). Override for a custom one; not called under
        DeepSpeed, whose engine runs it."""
        loss.backward(*args, **kwargs)

    def configure_callbacks(self) -> Callback | list[Callback]:
        """Callbacks this module brings: each replaces the Trainer's callbacks of its class (or
        a parent class), the rest are added (`trainer.trainer.module_callbacks`). Default: none."""
        return []

    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip before each optimizer step (automatic optimization), on unscaled gradients; gets
        the Trainer's ``gradient_clip_val`` / ``gradient_clip_algorithm``. Override to clip
        your way; the default calls ``self.clip_gradients`` with them."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def clip_gradients(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the gradients of ``optimizer``'s parameters, after undoing loss scaling: by their
        total norm (``"norm"``) or element-wise (``"value"``). None takes the Trainer's value
        and algorithm; a value of 0 clips nothing.

        Raises:
            ConfigurationError: ``gradient_clip_val`` differs from the Trainer's (Lightning: use
                one of them), or the algorithm is neither "norm" nor "value".
        """
        trainer = self._trainer
        trainer_value = trainer.gradient_clip_val if trainer is not None else None
        if gradient_clip_val is None:
            gradient_clip_val = trainer_value
        elif trainer_value is not None and trainer_value != gradient_clip_val:
            raise ConfigurationError(
                f"clip_gradients(gradient_clip_val={gradient_clip_val!r}) while "
                f"Trainer(gradient_clip_val={trainer_value!r}): use only one of them."
            )
        if not gradient_clip_val:
            return
        if gradient_clip_algorithm is None and trainer is not None:
            gradient_clip_algorithm = trainer.gradient_clip_algorithm
        algorithm = (gradient_clip_algorithm or "norm").lower()
        if algorithm not in ("norm", "value"):
            raise ConfigurationError(
                f"clip_gradients(gradient_clip_algorithm={algorithm!r}): expected 'norm' or 'value'."
            )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        accelerator = self.trainer.accelerator  # its clip_grad_*_ undo loss scaling first
        if algorithm == "norm":
            accelerator.clip_grad_norm_(params, gradient_clip_val)
        else:
            accelerator.clip_grad_value_(params, gradient_clip_val)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every process's tensors in ``data`` (a tensor, or dicts / lists / tuples of them),
        stacked on a new first dimension of size ``world_size``; on one process, ``data`` as it
        is (as Lightning). ``sync_grads=True`` lets gradients flow back through the gather.
        Python numbers and NumPy arrays are made tensors first, as Lightning does (bool: uint8,
        int: int32, float: float32), on the module's device."""
        as_tensor = functools.partial(number_as_tensor, device=self.device)
        if self.world_size == 1 and group is None:
            return map_tensors(lambda tensor: tensor, data, numbers=as_tensor)
        import torch.distributed as dist

        def gather(tensor: torch.Tensor) -> torch.Tensor:
            if sync_grads:
                from torch.distributed.nn.functional import all_gather

                return torch.stack(all_gather(tensor, group=group or dist.group.WORLD))
            if group is None:
                return self.trainer.strategy.all_gather(tensor)
            pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
            dist.all_gather(pieces, tensor.contiguous(), group=group)
            return torch.stack(pieces)

        return map_tensors(gather, data, numbers=as_tensor)

    def freeze(self) -> None:
        """Every parameter stops requiring gradients, and the module goes to eval mode."""
        for param in self.parameters():
            param.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        """Every parameter requires gradients again, and the module goes to train mode."""
        for param in self.parameters():
            param.requires_grad = True
        self.train()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank zero only."""
        if self.global_rank == 0:
            print(*args, **kwargs)

    @restricted_classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike[str],
        map_location: str | torch.device | None = None,
        hparams_file: str | os.PathLike[str] | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        """A new module of this class, built from the checkpoint's hyperparameters, with its
        weights (Lightning's ``load_from_checkpoint``).

        The class is called with the hyperparameters ``save_hyperparameters`` recorded (those its
        ``__init__`` takes), ``kwargs`` overriding them; ``on_load_checkpoint(checkpoint)`` runs;
        then the weights load (``strict=None`` means True). Call it on the class, not an instance.

        Args:
            checkpoint_path: a checkpoint directory (verified first; FSDP / DeepSpeed shards are
                merged), a ``.safetensors`` file, or a Lightning ``.ckpt`` (read without running
                code).
            map_location: the device the weights and the module go to (default: the CPU).
            hparams_file: a YAML file (a logger's ``hparams.yaml``) whose values replace the
                checkpoint's hyperparameters.
            strict: whether every weight must match a parameter or buffer, and back.
            kwargs: ``__init__`` arguments that override the saved ones.

        Raises:
            CheckpointError: the checkpoint fails verification, or its weights do not fit.
            ConfigurationError: called on an instance, or ``__init__`` needs an argument that
                neither the checkpoint nor ``kwargs`` holds.

        Examples:
            >>> model = Classifier.load_from_checkpoint("checkpoints/epoch=9-step=380")  # doctest: +SKIP
            >>> model = Classifier.load_from_checkpoint(path, lr=1e-4)  # doctest: +SKIP
        """
        return load_module(cls, checkpoint_path, map_location, hparams_file, strict, kwargs)  # type: ignore[return-value]
