"""ModelPruning: prune weights during fit with ``torch.nn.utils.prune``, as Lightning's callback.

This module owns which parameters are pruned, when (the end of each training or validation
epoch), by how much, the lottery-ticket reset to the initial values, and what checkpoints hold.
The pruning itself is torch's: a mask buffer and a forward pre-hook per pruned parameter
(``<name>_orig`` keeps the dense values, ``<name>_mask`` the zeros).
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.utils import prune

from trainer.callbacks.arguments import bad_argument
from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError

if TYPE_CHECKING:
    from trainer.trainer.module import TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["ModelPruning"]

_log = logging.getLogger(__name__)

_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "l1_unstructured": prune.l1_unstructured,
    "random_unstructured": prune.random_unstructured,
    "ln_structured": prune.ln_structured,
    "random_structured": prune.random_structured,
}
_METHODS: dict[str, type[prune.BasePruningMethod]] = {
    "l1_unstructured": prune.L1Unstructured,
    "random_unstructured": prune.RandomUnstructured,
    "ln_structured": prune.LnStructured,
    "random_structured": prune.RandomStructured,
}
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)

Parameters = Sequence[tuple[torch.nn.Module, str]]


class ModelPruning(Callback):
    """Prune parameters at the end of training epochs, with Lightning's arguments.

    Args:
        pruning_fn: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``, or a ``torch.nn.utils.prune.BasePruningMethod`` subclass
            (with ``use_global_unstructured=True``).
        parameters_to_prune: ``(module, name)`` pairs; empty: every ``weight`` / ``bias``
            (``parameter_names``) parameter of the module's layers.
        parameter_names: the names pruned when ``parameters_to_prune`` is empty.
        use_global_unstructured: one threshold over all the parameters
            (``prune.global_unstructured``) instead of one per parameter.
        amount: the fraction (float) or number (int) of weights to prune, or a function of the
            epoch returning it (0: none this epoch).
        apply_pruning: whether to prune, or a function of the epoch returning it.
        make_pruning_permanent: at the end of fit, remove the masks and keep the pruned values;
            checkpoints hold the pruned weights (no masks) either way.
        use_lottery_ticket_hypothesis: after each pruning, reset the unpruned weights to their
            values at the start of fit (or a function of the epoch deciding it).
        resample_parameters: with the lottery ticket, draw new initial values instead.
        pruning_dim: the dimension structured pruning removes along (required for them).
        pruning_norm: the norm of ``ln_structured`` (required for it).
        verbose: 0, 1 (the total sparsity after each pruning, logged) or 2 (per parameter too).
        prune_on_train_epoch_end: prune at the end of the training epoch; False: at the end of
            the validation epoch (not the sanity check).

    Raises:
        ConfigurationError: an argument is unknown, incomplete or out of range.
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable[..., Any] | str,
        parameters_to_prune: Parameters = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: int | float | Callable[[int], int | float] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        names = parameter_names or list(self.PARAMETER_NAMES)
        unknown = [name for name in names if name not in self.PARAMETER_NAMES]
        if unknown:
            raise bad_argument("ModelPruning", "parameter_names", names, "'weight' and/or 'bias'")
        self._global_kwargs: dict[str, Any] = {}
        if isinstance(pruning_fn, str):
            pruning_fn = self._by_name(
                pruning_fn.lower(), use_global_unstructured, pruning_dim, pruning_norm
            )
        elif not (inspect.isclass(pruning_fn) and issubclass(pruning_fn, prune.BasePruningMethod)):
            raise bad_argument(
                "ModelPruning",
                "pruning_fn",
                pruning_fn,
                f"one of {sorted(_FUNCTIONS)} or a BasePruningMethod subclass (the class)",
            )
        elif not use_global_unstructured:
            raise ConfigurationError(
                "ModelPruning(pruning_fn=<a BasePruningMethod>): supported with "
                "use_global_unstructured=True only (as in Lightning)."
            )
        if use_global_unstructured and getattr(pruning_fn, "PRUNING_TYPE", None) != "unstructured":
            raise ConfigurationError(
                f"ModelPruning(use_global_unstructured=True): {pruning_fn} is not an "
                "unstructured method; use an *_unstructured one, or use_global_unstructured=False."
            )
        if isinstance(amount, bool) or not (isinstance(amount, int | float) or callable(amount)):
            raise bad_argument("ModelPruning", "amount", amount, "an int, a float or a function")
        if verbose not in (0, 1, 2):
            raise bad_argument("ModelPruning", "verbose", verbose, "0, 1 or 2")
        self.pruning_fn = pruning_fn
        self.amount = amount
        self._parameters_to_prune: Parameters = parameters_to_prune
        self._parameter_names = names
        self._use_global_unstructured = use_global_unstructured
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._verbose = verbose
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._initial: dict[int, tuple[torch.nn.Module, list[tuple[int, str]]]] = {}

    def _by_name(
        self, name: str, is_global: bool, dim: int | None, norm: int | None
    ) -> Callable[..., Any]:
        if name not in _FUNCTIONS:
            raise bad_argument("ModelPruning", "pruning_fn", name, f"one of {sorted(_FUNCTIONS)}")
        kwargs: dict[str, Any] = {}
        if name.endswith("_structured"):
            if dim is None:
                raise ConfigurationError(
                    f"ModelPruning(pruning_fn={name!r}): structured pruning needs pruning_dim."
                )
            if name == "ln_structured":
                if norm is None:
                    raise ConfigurationError(
                        "ModelPruning(pruning_fn='ln_structured'): it needs pruning_norm."
                    )
                kwargs["n"] = norm
            kwargs["dim"] = dim
        if is_global:
            self._global_kwargs = kwargs
            return _METHODS[name]
        return functools.partial(_FUNCTIONS[name], **kwargs)

    # ---- which parameters ------------------------------------------------------------------
    def filter_parameters_to_prune(self, parameters_to_prune: Parameters = ()) -> Parameters:
        """Override to choose among the parameters found (default: all of them)."""
        return parameters_to_prune

    def sanitize_parameters_to_prune(
        self, module: torch.nn.Module, parameters_to_prune: Parameters = ()
    ) -> Parameters:
        """The given ``(module, name)`` pairs, checked; or, when none is given, every
        ``parameter_names`` parameter of the module's layers (containers left out).

        Raises:
            ConfigurationError: a pair names a module or a parameter the model does not have.
        """
        from trainer.trainer.module import TrainModule

        layers = [m for m in module.modules() if not isinstance(m, (*_CONTAINERS, TrainModule))]
        if not parameters_to_prune:
            return [
                (layer, name)
                for name in self._parameter_names
                for layer in layers
                if isinstance(getattr(layer, name, None), torch.nn.Parameter)
            ]
        pairs = list(parameters_to_prune)
        if not all(
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and isinstance(pair[0], torch.nn.Module)
            and isinstance(pair[1], str)
            for pair in pairs
        ):
            raise bad_argument(
                "ModelPruning", "parameters_to_prune", parameters_to_prune, "(module, name) pairs"
            )
        missing = [
            f"{type(layer).__name__}.{name}"
            for layer, name in pairs
            if not any(layer is m for m in layers) or not hasattr(layer, name)
        ]
        if missing:
            raise ConfigurationError(
                f"ModelPruning(parameters_to_prune=...): {missing} are not in the model."
            )
        return pairs

    # ---- pruning -----------------------------------------------------------------------------
    def apply_pruning(self, amount: int | float) -> None:
        """Prune ``amount`` now (globally or parameter by parameter)."""
        before = [self._zeros(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            kwargs = {**self._global_kwargs, "amount": amount}
            accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
            prune.global_unstructured(
                self._parameters_to_prune,
                pruning_method=self.pruning_fn,
                **{k: v for k, v in kwargs.items() if k in accepted},
            )
        else:
            for layer, name in self._parameters_to_prune:
                self.pruning_fn(layer, name=name, amount=amount)
        if self._verbose:
            self._log_sparsity(before, amount)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Reset the unpruned values to those of the start of fit (or new random ones)."""
        for original, names in self._initial.values():
            source = original
            if self._resample_parameters and callable(getattr(original, "reset_parameters", None)):
                source = copy.deepcopy(original)
                source.reset_parameters()
            for index, name in names:
                layer, _ = self._parameters_to_prune[index]
                target = getattr(layer, f"{name}_orig", None)
                if target is None:
                    target = getattr(layer, name)
                value = getattr(source, name)
                if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
                    target.data = value.data.to(target.device)

    def make_pruning_permanent(self, module: torch.nn.Module) -> None:
        """Remove every pruning mask and hook of ``module``; the pruned values stay."""
        for layer in module.modules():
            for key, hook in list(layer._forward_pre_hooks.items()):  # noqa: SLF001 - torch's registry
                if isinstance(hook, prune.BasePruningMethod):
                    hook.remove(layer)
                    del layer._forward_pre_hooks[key]  # noqa: SLF001

    def _run(self, epoch: int) -> None:
        is_due = (
            self._apply_pruning(epoch) if callable(self._apply_pruning) else self._apply_pruning
        )
        amount = self.amount(epoch) if callable(self.amount) else self.amount
        if not is_due or not amount:
            return
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()

    # ---- hooks -----------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        found = self.sanitize_parameters_to_prune(module, self._parameters_to_prune)
        self._parameters_to_prune = self.filter_parameters_to_prune(found)
        self._initial = {}
        if self._use_lottery_ticket_hypothesis:
            for index, (layer, name) in enumerate(self._parameters_to_prune):
                entry = self._initial.setdefault(id(layer), (copy.deepcopy(layer), []))
                entry[1].append((index, name))

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._prune_on_train_epoch_end:
            self._run(module.current_epoch)

    def on_validation_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            self._run(module.current_epoch)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(module)

    def on_save_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None:
        if not self._make_pruning_permanent:
            return
        # The checkpoint gets the pruned values under the parameters' own names; training goes
        # on with its masks.
        weights = dict(checkpoint["state_dict"])
        for name in [k[: -len("_mask")] for k in weights if k.endswith("_mask")]:
            original = weights.pop(f"{name}_orig")
            mask = weights.pop(f"{name}_mask")
            weights[name] = mask.to(dtype=original.dtype) * original
        checkpoint["state_dict"] = weights

    # ---- reporting ---------------------------------------------------------------------------
    @staticmethod
    def _zeros(layer: torch.nn.Module, name: str) -> tuple[int, int]:
        mask = getattr(layer, f"{name}_mask", None)
        return (0, 1) if mask is None else (int((mask == 0).sum()), mask.numel())

    def _log_sparsity(self, before: list[tuple[int, int]], amount: int | float) -> None:
        after = [self._zeros(m, n) for m, n in self._parameters_to_prune]
        total = sum(size for _, size in after)
        was, now = sum(z for z, _ in before), sum(z for z, _ in after)
        _log.info(
            "ModelPruning: pruned %d/%d (%.2f%%) -> %d/%d (%.2f%%)",
            was, total, 100 * was / total, now, total, 100 * now / total,
        )  # fmt: skip
        if self._verbose == 2:
            for (layer, name), (z0, n0), (z1, n1) in zip(
                self._parameters_to_prune, before, after, strict=True
            ):
                _log.info(
                    "ModelPruning: %r.%s with amount=%s: %.2f%% -> %.2f%%",
                    layer, name, amount, 100 * z0 / n0, 100 * z1 / n1,
                )  # fmt: skip
