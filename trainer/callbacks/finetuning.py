"""BaseFinetuning and BackboneFinetuning: freeze parts of a model, then unfreeze them by epoch.

This module owns Lightning 2.6's finetuning callbacks: the freezing helpers (``freeze``,
``make_trainable``, ``unfreeze_and_add_param_group``, ...), calling ``freeze_before_training``
at setup and ``finetune_function`` at each epoch start, and keeping the param groups they add in
checkpoints (by parameter name), so a resumed run rebuilds them before the optimizer state is
loaded. It does not choose learning rates beyond ``BackboneFinetuning``'s schedule, and never
touches an optimizer outside the epoch-start hook and the restore.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm

from trainer._warnings import warn_user
from trainer.callbacks.callback import Callback
from trainer.errors import CheckpointError, ConfigurationError, describe

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]

Modules = Module | Iterable[Any]  # a module, or a (nested) iterable of modules
_METADATA = "internal_optimizer_metadata"


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default ``lambda_func``: double the backbone rate every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Freeze modules before training and unfreeze them during it (Lightning's base class).

    Override ``freeze_before_training(module)`` (called at setup, before
    ``configure_optimizers``: build the optimizer from parameters that require grad) and
    ``finetune_function(module, epoch, optimizer)`` (called at each epoch start, for each
    optimizer; add what you unfreeze as a new param group). The param groups added are saved in
    checkpoints by parameter name and rebuilt on resume, before the optimizer state is loaded;
    their parameters train again (Lightning leaves them frozen after a resume).

    Examples:
        >>> class Unfreeze(BaseFinetuning):
        ...     def freeze_before_training(self, module):
        ...         self.freeze(module.feature_extractor)
        ...
        ...     def finetune_function(self, module, epoch, optimizer):
        ...         if epoch == 10:  # feature_extractor trains from epoch 10, at lr / 10
        ...             self.unfreeze_and_add_param_group(module.feature_extractor, optimizer)
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False

    def state_dict(self) -> dict[str, Any]:
        return {_METADATA: self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved param groups; they are rebuilt once the optimizers exist.

        Raises:
            CheckpointError: the saved groups are not a dict of optimizer index to a list of
                groups whose ``params`` are parameter names.
        """
        self._restarting = True
        self._internal_optimizer_metadata = _checked_metadata(
            state_dict.get(_METADATA, state_dict), type(self).__name__
        )

    # ---- hooks --------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self.freeze_before_training(module)
        if any(klass.__name__ == "DeepSpeedStrategy" for klass in type(trainer.strategy).__mro__):
            raise ConfigurationError(
                f"{type(self).__name__} does not support the DeepSpeed strategy (it changes the "
                "optimizer's param groups during training). Choose another strategy or remove "
                "the callback."
            )

    def on_load_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None:
        # The optimizer state about to be restored has the added groups: rebuild them first.
        state = (checkpoint.get("callbacks") or {}).get(self.state_key)
        if state is not None and trainer.optimizers:
            self.load_state_dict(state)
            self._restore_param_groups(trainer, module)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._restarting:
            self._restore_param_groups(trainer, module)
        self._restarting = False

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            optimizer = _unwrap(optimizer)
            count = len(optimizer.param_groups)
            self.finetune_function(module, trainer.current_epoch, optimizer)
            self._store(module, index, count, optimizer.param_groups)

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: Optimizer) -> None:
        """Override to unfreeze what ``epoch`` trains (called at each epoch start)."""
        raise NotImplementedError(f"{type(self).__name__} must implement finetune_function.")

    def freeze_before_training(self, pl_module: TrainModule) -> None:
        """Override to freeze modules before ``configure_optimizers``."""
        raise NotImplementedError(f"{type(self).__name__} must implement freeze_before_training.")

    # ---- helpers (Lightning's static methods) ---------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Modules) -> list[Module]:
        """The leaf modules of ``modules``, and the parents that hold parameters themselves."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            flat: list[Module] = []
            for module in modules:
                flat.extend(BaseFinetuning.flatten_modules(module))
            candidates: Iterable[Module] = flat
        else:
            candidates = modules.modules()
        # As Lightning: a parameter registered as None (bias=False) counts too.
        return [m for m in candidates if not list(m.children()) or m._parameters]  # noqa: SLF001

    @staticmethod
    def filter_params(
        modules: Modules, train_bn: bool = True, requires_grad: bool = True
    ) -> Generator[torch.nn.Parameter, None, None]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (BatchNorm
        layers left out when not ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze the parameters of ``modules`` (BatchNorm tracks running stats again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """Freeze one module's own parameters (BatchNorm stops tracking running stats)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their BatchNorm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[Any]) -> list[Any]:
        """``params`` that are not already in ``optimizer`` (the others with a warning)."""
        kept, skipped = [], []
        for param in params:
            is_present = any(
                torch.equal(p, param) for group in optimizer.param_groups for p in group["params"]
            )
            (skipped if is_present else kept).append(param)
        if skipped:
            warn_user(
                "The provided params to be frozen already exist within another group of this "
                "optimizer. Those parameters will be skipped.\nHINT: Did you init your optimizer "
                "in `configure_optimizer` as such:\n "
                f"{type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) "
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new param group,
        at ``lr``, or the first group's lr divided by ``initial_denom_lr``."""
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denom_lr = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        params = BaseFinetuning.filter_on_optimizer(optimizer, params)
        if params:
            optimizer.add_param_group({"params": params, "lr": params_lr / denom_lr})

    # ---- checkpointed param groups --------------------------------------------------------------
    def _store(self, module: Module, index: int, count: int, groups: list[dict[str, Any]]) -> None:
        """Record the optimizer's groups by parameter name (the new ones after the first time)."""
        names = {param: name for name, param in module.named_parameters()}
        if index not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[index] = _map_params(groups, names)
        elif count != len(groups):
            self._internal_optimizer_metadata[index].extend(_map_params(groups[count:], names))

    def _restore_param_groups(self, trainer: Trainer, module: Module) -> None:
        """On resume: give each optimizer the param groups the saved run had, unless it has
        them already (rebuilt at ``on_load_checkpoint``, its state loaded since)."""
        parameters = dict(module.named_parameters())
        for index, optimizer in enumerate(trainer.optimizers):
            groups = self._internal_optimizer_metadata.get(index)
            if groups is None or len(_unwrap(optimizer).param_groups) >= len(groups):
                continue
            missing = {n for g in groups for n in g["params"]} - set(parameters)
            if missing:
                raise CheckpointError(
                    f"{type(self).__name__} state: the checkpoint's param groups name parameters "
                    f"the module does not have: {sorted(missing)[:5]}. Resume with the module "
                    "the checkpoint was written with."
                )
            inner = _unwrap(optimizer)
            added = _map_params(groups[len(inner.param_groups) :], parameters)
            inner.param_groups = _map_params(groups, parameters)
            # setup froze them again: what the saved run had unfrozen trains again (Lightning
            # leaves it frozen, so its resumed run differs from an uninterrupted one)
            _make_params_trainable(module, {id(p) for group in added for p in group["params"]})


class BackboneFinetuning(BaseFinetuning):
    """Train ``module.backbone`` from ``unfreeze_backbone_at_epoch``, its lr rising each epoch.

    The backbone is frozen before training. At ``unfreeze_backbone_at_epoch`` it joins the
    optimizer as a new param group at ``backbone_initial_lr`` (default: the current lr ×
    ``backbone_initial_ratio_lr``); each later epoch multiplies that rate by
    ``lambda_func(epoch + 1)``, capped at the current lr when ``should_align``.

    Args:
        unfreeze_backbone_at_epoch: the epoch the backbone starts training.
        lambda_func: ``epoch -> factor`` for the backbone lr (default: 2.0 every epoch).
        backbone_initial_ratio_lr: the backbone's starting lr as a fraction of the current lr.
        backbone_initial_lr: the backbone's starting lr (overrides the ratio).
        should_align: never let the backbone lr exceed the current lr.
        initial_denom_lr: passed to `unfreeze_and_add_param_group` (unused when an lr is set).
        train_bn: train the backbone's BatchNorm layers.
        verbose: print both learning rates at each epoch start from the unfreeze on.
        rounding: decimals of the printed rates.

    Raises:
        ConfigurationError: at fit start, the module has no ``backbone`` attribute that is an
            ``nn.Module``.

    Examples:
        >>> BackboneFinetuning(unfreeze_backbone_at_epoch=5, lambda_func=lambda epoch: 1.5)
        >>> # epoch 5: backbone lr = 0.1 × current lr; epoch 6: × 1.5; ... up to the current lr
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None
        self._is_global_zero = True  # prints only there

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        previous = state_dict.get("previous_backbone_lr")
        if previous is not None and not isinstance(previous, int | float):
            raise CheckpointError(
                f"BackboneFinetuning state, field 'previous_backbone_lr': expected a number or "
                f"None, received {describe(previous)}. Resume from another checkpoint."
            )
        self.previous_backbone_lr = previous
        super().load_state_dict(state_dict)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not isinstance(getattr(module, "backbone", None), Module):
            raise ConfigurationError(
                f"BackboneFinetuning: {type(module).__name__} has no `backbone` attribute that "
                "is an nn.Module. Assign the part to finetune to self.backbone."
            )
        self._is_global_zero = trainer.is_global_zero
        super().on_fit_start(trainer, module)

    def freeze_before_training(self, pl_module: TrainModule) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = (
                self.backbone_initial_lr
                if self.backbone_initial_lr is not None
                else current_lr * self.backbone_initial_ratio_lr
            )
            self.previous_backbone_lr = backbone_lr
            self.unfreeze_and_add_param_group(
                pl_module.backbone,
                optimizer,
                backbone_lr,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
        elif epoch > self.unfreeze_backbone_at_epoch:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr
            self.previous_backbone_lr = backbone_lr
        else:
            return
        if self.verbose and self._is_global_zero:
            print(
                f"Current lr: {round(current_lr, self.rounding)}, "
                f"Backbone lr: {round(backbone_lr, self.rounding)}"
            )


def _map_params(groups: list[dict[str, Any]], mapping: dict[Any, Any]) -> list[dict[str, Any]]:
    """``groups`` with each parameter replaced through ``mapping`` (to its name or back)."""
    return [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [mapping[p] for p in group["params"]],
        }
        for group in groups
    ]


def _make_params_trainable(module: Module, ids: set[int]) -> None:
    """Unfreeze exactly the parameters in ``ids``, and let their BatchNorm layers track stats."""
    for submodule in module.modules():
        own = [p for p in submodule.parameters(recurse=False) if id(p) in ids]
        for param in own:
            param.requires_grad = True
        if own and isinstance(submodule, _BatchNorm):
            submodule.track_running_stats = True


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside a prepared wrapper (its param groups are the real ones)."""
    return getattr(optimizer, "optimizer", optimizer)


def _checked_metadata(value: object, owner: str) -> dict[int, list[dict[str, Any]]]:
    """The saved param groups, keys as ints, after checking their shape (untrusted input)."""

    def is_group(group: object) -> bool:
        return (
            isinstance(group, dict)
            and isinstance(group.get("params"), list)
            and all(isinstance(name, str) for name in group["params"])
        )

    if isinstance(value, dict):
        try:
            checked = {int(key): groups for key, groups in value.items()}
        except (TypeError, ValueError):
            checked = None
        if checked is not None and all(
            isinstance(groups, list) and all(is_group(g) for g in groups)
            for groups in checked.values()
        ):
            return checked
    raise CheckpointError(
        f"{owner} state, field {_METADATA!r}: expected a dict of optimizer index to a list of "
        f"param groups naming their parameters, received {describe(value)}. The checkpoint is "
        "corrupt or was not written by this callback; resume from another checkpoint."
    )
