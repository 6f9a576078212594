"""BatchSizeFinder: the largest batch size that trains without running out of memory.

This module owns the search (Lightning's "power" and "binsearch" modes), the trials (a few
training steps per candidate size through the fit's own batch step, on a state captured before
and put back after each, see `trainer.callbacks.finder_steps`), where the batch size is read and
written (the module's or datamodule's attribute or ``hparams`` entry), and handing the Trainer a
train dataloader rebuilt with the size found. It does not own memory accounting: a trial fails
exactly when it raises an error that ``trainer.accelerator.memory.is_out_of_memory`` recognises.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.accelerator.memory import empty_device_cache, is_out_of_memory
from trainer.callbacks.arguments import bad_argument, is_int, is_number
from trainer.callbacks.callback import Callback
from trainer.callbacks.finder_steps import TrainingState, run_training_steps
from trainer.data.combined import CombinedLoader
from trainer.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.trainer.module import DataModule, TrainModule
    from trainer.trainer.trainer import Trainer

__all__ = ["BatchSizeFinder"]

_MODES = ("power", "binsearch")


class BatchSizeFinder(Callback):
    """Find the largest batch size that fits, before the fit trains (Lightning's semantics).

    At ``on_fit_start`` the callback sets the batch size to ``init_val`` and runs
    ``steps_per_trial`` training steps at each candidate size, rebuilding the train dataloader
    from ``train_dataloader()`` of the DataModule or the module, which must read the size from
    ``<batch_arg_name>`` (an attribute or ``hparams`` entry of the module or DataModule). Every
    trial starts from the same captured state (weights, optimizer, precision, RNG), which is put
    back afterwards, so the fit starts where it would have without the search. A trial's steps
    are the fit's (accumulation, clipping, precision) and run the module's batch hooks but no
    callback's, as in Lightning.

    ``mode="power"`` doubles the size after each success and stops at the first out-of-memory
    error, keeping the last size that worked; ``mode="binsearch"`` continues from there by
    bisection between the last success and the first failure, then takes ``margin`` off the
    size found. A failure before any success halves (power) or bisects down (binsearch). The
    search follows Lightning 2.6 step for step, its edges included: doubling stops once the size
    covers the dataset (the size may then exceed its length), a size that reaches ``max_val`` is
    capped there and ends the search without a trial, and in binsearch ``max_trials`` counts
    successful trials.
    The fit then trains with ``optimal_batch_size``, which is also saved in checkpoints, so a
    resumed fit reuses it without searching again.

    Args:
        mode: "power" or "binsearch".
        steps_per_trial: optimizer steps run at each candidate size.
        init_val: the first size tried.
        max_trials: the most trials (sizes tried) of the search.
        batch_arg_name: the attribute or ``hparams`` key that holds the batch size.
        margin: the fraction taken off the size binsearch found (``int(size * (1 - margin))``,
            at least 1), a safety buffer; power mode ignores it.
        max_val: the largest size the search sets.

    Attributes:
        optimal_batch_size: the size found (None before the search).

    Raises:
        ConfigurationError: an argument is out of range (the message names it), the batch size
            or a ``train_dataloader()`` to rebuild is missing, several processes run, or even
            the smallest size ran out of memory.

    Examples:
        >>> finder = BatchSizeFinder(mode="binsearch", init_val=16)
        >>> Trainer(max_epochs=3, callbacks=[finder]).fit(module)  # module.batch_size = 16
        >>> # 16, 32 and 64 fit, 128 runs out of memory; bisection tries 96, 112, 104, ...
        >>> finder.optimal_batch_size == module.batch_size  # e.g. 104
        True
    """

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> None:
        if mode not in _MODES:
            raise bad_argument("BatchSizeFinder", "mode", mode, "'power' or 'binsearch'")
        for name, value in (
            ("steps_per_trial", steps_per_trial),
            ("init_val", init_val),
            ("max_trials", max_trials),
            ("max_val", max_val),
        ):
            if not is_int(value) or value < 1:
                raise bad_argument("BatchSizeFinder", name, value, "an int >= 1")
        if not is_number(margin) or not 0.0 <= margin < 1.0:
            raise bad_argument("BatchSizeFinder", "margin", margin, "a float in [0, 1), e.g. 0.05")
        if not isinstance(batch_arg_name, str) or not batch_arg_name:
            raise bad_argument(
                "BatchSizeFinder", "batch_arg_name", batch_arg_name, "a name, e.g. 'batch_size'"
            )
        self.mode = mode
        self.steps_per_trial = steps_per_trial
        self.init_val = init_val
        self.max_trials = max_trials
        self.batch_arg_name = batch_arg_name
        self.margin = float(margin)
        self.max_val = max_val
        self.optimal_batch_size: int | None = None
        self._restored_size: int | None = None  # from a checkpoint: reused, not searched again

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.fast_dev_run:
            warnings.warn("BatchSizeFinder: skipped because fast_dev_run is set.", stacklevel=2)
            return
        if trainer.world_size > 1:
            raise ConfigurationError(
                f"BatchSizeFinder runs on one process; this fit has {trainer.world_size}. Find "
                "the batch size on one device, then set it (per process) for the distributed run."
            )
        restored, self._restored_size = self._restored_size, None
        if restored is not None:
            self.optimal_batch_size = restored
            self._use_batch_size(trainer, module, restored)
            return
        self.scale_batch_size(trainer, module)

    def scale_batch_size(self, trainer: Trainer, module: TrainModule) -> int:
        """Search now, leave the size found in place for the fit, and return it."""
        holders = _holders(module, trainer.datamodule, self.batch_arg_name)
        # Also fails here, before any trial, when there is no train_dataloader() to rebuild.
        dataset_size = _dataset_length(_build_loader(module, trainer.datamodule))
        state = TrainingState.capture(trainer, module)

        def trial(size: int) -> bool:
            _set_batch_size(holders, size, self.batch_arg_name)
            loader = trainer.accelerator.prepare_data_loader(
                _build_loader(module, trainer.datamodule)
            )
            try:
                run_training_steps(trainer, loader, self.steps_per_trial)
                is_fitting = True
            except Exception as err:  # only out-of-memory is an answer; anything else is a bug
                if not is_out_of_memory(err):
                    raise
                is_fitting = False
            finally:
                state.restore()
            if not is_fitting and torch.cuda.is_available():
                empty_device_cache()  # the failed trial's tensors may sit in reference cycles
            return is_fitting

        search = _search_power if self.mode == "power" else _search_binary
        original = _get_batch_size(holders, self.batch_arg_name)
        try:
            size = search(trial, self.init_val, self.max_trials, dataset_size, self.max_val)
        except BaseException:
            _set_batch_size(holders, original, self.batch_arg_name)
            raise
        if self.mode == "binsearch" and self.margin > 0:  # Lightning's safety margin
            size = max(1, int(size * (1 - self.margin)))
        self.optimal_batch_size = size
        self._use_batch_size(trainer, module, size)
        return size

    def _use_batch_size(self, trainer: Trainer, module: TrainModule, size: int) -> None:
        _set_batch_size(
            _holders(module, trainer.datamodule, self.batch_arg_name), size, self.batch_arg_name
        )
        trainer.reset_train_dataloader()  # the fit trains on a loader built with the found size

    def state_dict(self) -> dict[str, Any]:
        return {"optimal_batch_size": self.optimal_batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_size = state_dict.get("optimal_batch_size")


def _search_power(
    trial: Callable[[int], bool], size: int, max_trials: int, dataset_size: int | None, max_val: int
) -> int:
    """Lightning 2.6's power mode: double while trials succeed; the first failure after a
    success halves back to it and ends. A size reaching ``max_val`` ends the search untried."""
    has_doubled = False  # Lightning's any_success: a success was followed by a doubling
    is_capped = False
    for index in range(max_trials):
        if size >= max_val:
            is_capped = True
            break
        if trial(size):
            if index + 1 >= max_trials:
                break
            doubled = _adjusted(size, size * 2, dataset_size, max_val)
            if doubled == size:
                break
            size, has_doubled = doubled, True
        else:
            size //= 2
            if has_doubled or size < 1:
                break
    return size if is_capped else _checked(size)


def _search_binary(
    trial: Callable[[int], bool], size: int, max_trials: int, dataset_size: int | None, max_val: int
) -> int:
    """Lightning 2.6's binsearch mode: double until the first failure, then bisect between the
    last success (``low``, 1 before any) and the smallest failure. ``max_trials`` counts the
    successes; a size reaching ``max_val`` ends the search untried."""
    low, high = 1, None
    successes = 0
    while size < max_val:
        if trial(size):
            successes += 1
            if successes >= max_trials:
                break
            low = size
            if high is not None and high - low <= 1:
                break
            proposed = size * 2 if high is None else (high + low) // 2
            following = _adjusted(size, proposed, dataset_size, max_val)
            if following == size:
                break
            size = following
        else:
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
    return _checked(size)


def _adjusted(size: int, proposed: int, dataset_size: int | None, max_val: int) -> int:
    """Lightning's next size after a success: ``proposed`` capped at ``max_val``; unchanged
    once ``size`` covers the whole dataset."""
    if dataset_size is not None and size >= dataset_size:
        return size
    return min(proposed, max_val)


def _checked(size: int) -> int:
    if size < 1:
        raise ConfigurationError(
            "BatchSizeFinder: every batch size tried ran out of memory (down to 1, or until "
            "max_trials). Make the model or the samples smaller, or raise max_trials."
        )
    return size


def _holders(
    module: TrainModule, datamodule: DataModule | None, name: str
) -> list[tuple[Any, bool]]:
    """Where the batch size lives: ``(object, is_hparams)`` for each place that has it."""
    found: list[tuple[Any, bool]] = []
    for owner in (module, datamodule):
        if owner is None:
            continue
        if name in owner.hparams:
            found.append((owner, True))
        if hasattr(owner, name) and not callable(getattr(owner, name)):
            found.append((owner, False))
    if not found:
        where = type(module).__name__ + (
            f" or {type(datamodule).__name__}" if datamodule is not None else ""
        )
        raise ConfigurationError(
            f"BatchSizeFinder(batch_arg_name={name!r}): {where} has no attribute or hparams "
            f"entry {name!r}. Store the batch size there and build the train DataLoader from it "
            "in train_dataloader(), or pass the right batch_arg_name."
        )
    return found


def _get_batch_size(holders: list[tuple[Any, bool]], name: str) -> Any:
    owner, is_hparams = holders[0]
    return owner.hparams[name] if is_hparams else getattr(owner, name)


def _set_batch_size(holders: list[tuple[Any, bool]], size: int, name: str) -> None:
    for owner, is_hparams in holders:
        if is_hparams:
            owner.hparams[name] = size
        else:
            setattr(owner, name, size)


def _build_loader(module: TrainModule, datamodule: DataModule | None) -> Any:
    """A fresh train DataLoader from the DataModule, else the module (the Trainer's order)."""
    for source in (datamodule, module):
        function = getattr(source, "train_dataloader", None)
        loader = function() if callable(function) else None
        if isinstance(loader, dict | list | tuple | CombinedLoader):
            raise ConfigurationError(
                f"BatchSizeFinder scales one train dataloader; train_dataloader() of "
                f"{type(source).__name__} returned several ({describe(loader)}). Find the size "
                "with one of them, or set the batch sizes yourself."
            )
        if loader is not None:
            return loader
    raise ConfigurationError(
        f"BatchSizeFinder rebuilds the train dataloader at each size, so it needs "
        f"train_dataloader() on {type(module).__name__} or its DataModule, built from the batch "
        "size attribute (a DataLoader passed to fit() cannot be rebuilt)."
    )


def _dataset_length(loader: Any) -> int | None:
    try:
        return len(loader.dataset)
    except TypeError:  # an iterable dataset: no length to cap the search at
        return None
