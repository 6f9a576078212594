"""The dataloaders of one Trainer call, stage by stage: found, prepared, counted, reloaded.

- `load_stage`: a stage's data (the call's argument, else the DataModule's, else the module's
  ``*_dataloader()``). Training takes one DataLoader; validation, test and predict take one or a
  list / tuple / dict of them, kept as a list in that order (position = ``dataloader_idx``, as in
  Lightning). With ``overfit_batches`` the train (and, in ``fit``, validation) loaders read in
  order. Sets ``trainer.num_*_batches`` (the sum over an evaluation stage's loaders).
- `reload_stage` / `is_reload_due`: ``reload_dataloaders_every_n_epochs``.
- `prepare_data`: the DataModule's and the module's ``prepare_data``, once per machine, with a
  barrier after it.
- `reset_train_loader`: ``Trainer.reset_train_dataloader`` (BatchSizeFinder).

The call's loaders (a dict, ``Run.loaders``) and the stages whose loaders the call received are
handed in; a reload replaces an entry of that dict. One DataLoader is prepared by
`trainer.trainer.prepare.prepare_loader`; the only hooks called here are ``prepare_data``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from trainer._warnings import warn_user
from trainer.data.combined import (
    TRAINING_MODES,
    CombinedLoader,
    PreparedCombinedLoader,
    check_mode,
    iterables_of,
)
from trainer.data.loader import DataLoaderShard
from trainer.data.rebuild import rebuild_loader
from trainer.errors import ConfigurationError
from trainer.runtime.seed import get_rng_states, set_rng_states
from trainer.trainer.data_hooks import batch_transfer
from trainer.trainer.prepare import find_loader, prepare_loader

if TYPE_CHECKING:
    from collections.abc import Set

    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["is_reload_due", "load_stage", "prepare_data", "reload_stage", "reset_train_loader"]

_COUNT_ATTRIBUTE = {
    "train": "num_training_batches",
    "validation": "num_val_batches",
    "test": "num_test_batches",
    "predict": "num_predict_batches",
}


def load_stage(trainer: Trainer, name: str, given: Any, *, required: bool) -> Any:
    """The prepared ``name`` loader ("train"), or list of loaders (an evaluation stage), or None.

    Several train loaders (a dict, list or tuple, or a `CombinedLoader`) become one
    `PreparedCombinedLoader`, as Lightning combines them; so does an evaluation stage's
    `CombinedLoader` in a mode other than "sequential" (a list of that one loader). Its
    "sequential" CombinedLoader is a list of its loaders, as a plain list is.

    Raises:
        ConfigurationError: none was found and ``required``; an item is not a DataLoader; a
            "sequential" CombinedLoader for training, or another mode for predict (as Lightning).
    """
    source = given if given is not None else find_loader(name, trainer.datamodule, trainer.module)
    if name == "predict" and isinstance(source, CombinedLoader):  # Lightning refuses the others
        check_mode(source.mode, "trainer.predict(CombinedLoader(...))", ("sequential",))
    is_read_together = name == "train" or (
        isinstance(source, CombinedLoader) and source.mode != "sequential"
    )
    several = iterables_of(source) if is_read_together and source is not None else None
    if several is not None and several[0]:
        combined = _load_combined(trainer, name, *several)
        return combined if name == "train" else [combined]
    if isinstance(source, CombinedLoader):  # evaluation: one loader after the other
        source = source.flattened
    if isinstance(source, dict):
        source = list(source.values())
    if source is None or (isinstance(source, list | tuple) and not source):
        if required:
            raise ConfigurationError(
                f"trainer: no {name} dataloader. Pass one to the call, return one from "
                f"{name if name != 'validation' else 'val'}_dataloader(), or use a DataModule."
            )
        if name == "train":
            trainer.num_training_batches = 0
        return None
    items = [source] if name == "train" or not isinstance(source, list | tuple) else list(source)
    is_overfitting = _is_overfitting(trainer, name)
    prepared, counts = [], []
    for dataloader_idx, item in enumerate(items):
        if is_overfitting and isinstance(item, DataLoader):
            item = _in_order(item, name)
        loader, count = prepare_loader(trainer, name, item, dataloader_idx)
        prepared.append(loader)
        counts.append(count)
    total = sum(counts)
    setattr(trainer, _COUNT_ATTRIBUTE[name], total if math.isinf(total) else int(total))
    if name == "validation" and trainer.state.stage == "fit":  # Lightning keeps the fit's
        steps = trainer.num_sanity_val_steps
        trainer.num_sanity_val_batches = [c if steps == -1 else min(steps, c) for c in counts]
    return prepared[0] if name == "train" else prepared


def _load_combined(
    trainer: Trainer, name: str, items: list[Any], spec: Any, mode: str
) -> PreparedCombinedLoader:
    """Several ``name`` loaders, each prepared alone, read together in ``mode``; the
    batch-transfer hooks get the whole batch with ``dataloader_idx=0`` (as in Lightning)."""
    where = "trainer.fit(train_dataloaders=...)" if name == "train" else f"the {name} loader"
    check_mode(mode, where, TRAINING_MODES)
    is_overfitting = _is_overfitting(trainer, name)
    prepared, counts = [], []
    for dataloader_idx, item in enumerate(items):
        if is_overfitting and isinstance(item, DataLoader):
            item = _in_order(item, name)
        loader, count = prepare_loader(
            trainer, name, item, dataloader_idx, with_transfer_hooks=False
        )
        prepared.append(loader)
        counts.append(count)
    transfer = batch_transfer(trainer.module, trainer.datamodule, trainer.accelerator.device, 0)
    combined = PreparedCombinedLoader(
        prepared,
        spec,
        mode,
        counts,
        gradient_state=trainer.accelerator.gradient_state,
        transform=transfer,
    )
    count = math.inf if combined.limit is None else combined.limit
    setattr(trainer, _COUNT_ATTRIBUTE[name], count)
    if name == "validation" and trainer.state.stage == "fit":
        steps = trainer.num_sanity_val_steps
        trainer.num_sanity_val_batches = [count if steps == -1 else min(steps, count)]
    return combined


def _is_overfitting(trainer: Trainer, name: str) -> bool:
    """Whether ``overfit_batches`` makes the ``name`` loaders read in order: the train loaders,
    and in ``fit`` the validation ones."""
    return trainer.overfit_batches > 0 and (
        name == "train" or (name == "validation" and trainer.state.stage == "fit")
    )


def keep_seeds(new: Any, old: Any) -> None:
    """Give the reloaded train loader(s) ``new`` the shuffle seeds of ``old``."""
    if isinstance(new, PreparedCombinedLoader) and isinstance(old, PreparedCombinedLoader):
        pairs = list(zip(new.loaders, old.loaders, strict=False))
    elif isinstance(new, DataLoaderShard) and isinstance(old, DataLoaderShard):
        pairs = [(new, old)]
    else:
        return
    for new_loader, old_loader in pairs:
        new_loader.load_state_dict({"seed": old_loader.state_dict()["seed"]})


def prepare_data(trainer: Trainer) -> None:
    """Lightning's ``prepare_data``: the DataModule's, then the module's (each when defined), on
    local rank zero of each machine (on global rank zero only with ``prepare_data_per_node =
    False``). Every process waits until it is done, so no ``setup`` reads half-written data."""
    from trainer.trainer.datamodule import DataModule
    from trainer.trainer.module import TrainModule

    for owner, base in ((trainer.datamodule, DataModule), (trainer.module, TrainModule)):
        if owner is None or getattr(type(owner), "prepare_data", None) is base.prepare_data:
            continue
        is_per_node = getattr(owner, "prepare_data_per_node", True)
        if trainer.local_rank == 0 and (is_per_node or trainer.node_rank == 0):
            owner.prepare_data()
        if trainer.world_size > 1:
            trainer.strategy.barrier()


def is_reload_due(every_n_epochs: int, epoch: int, last_epoch: float) -> bool:
    """Whether ``reload_dataloaders_every_n_epochs`` asks for new loaders at ``epoch``."""
    return bool(every_n_epochs) and epoch - last_epoch >= every_n_epochs


def end_workers(loaders: Iterable[Any]) -> None:
    """End the persistent workers of every prepared loader in ``loaders`` (a loader, a list of
    them, or None each), as Lightning does when a stage ends (`DataLoaderShard.end_workers`)."""
    for entry in loaders:
        for loader in entry if isinstance(entry, list | tuple) else [entry]:
            if isinstance(loader, DataLoaderShard | PreparedCombinedLoader):
                loader.end_workers()


def reload_stage(trainer: Trainer, name: str, run: Run) -> None:
    """Ask the DataModule / module for the ``name`` loaders again (not loaders given to the call).

    The global random state is left as it was, and the train loader keeps its shuffle seed, so a
    reload changes only what the new loader reads.

    Args:
        trainer: the Trainer whose DataModule / module give the loaders.
        name: the stage ("train", "validation").
        run: the call's `Run`; its ``loaders`` entry is replaced.
    """
    if name in run.given_stages:  # Lightning "reloads" the very same object: nothing to do
        return
    old = run.loaders.get(name)
    rng = get_rng_states()  # preparing draws a seed; the old loader's is kept instead
    new = run.loaders[name] = load_stage(trainer, name, None, required=name == "train")
    set_rng_states(rng)
    end_workers([old])
    if name == "train" and old is not None and new is not None:
        keep_seeds(new, old)


def reset_train_loader(trainer: Trainer, loaders: dict[str, Any], given_stages: Set[str]) -> None:
    """Rebuild the train loader from its source and prepare it again, keeping seed and epoch.

    Args:
        trainer: the Trainer whose DataModule / module give the loader.
        loaders: the call's loaders by stage; the "train" entry is replaced.
        given_stages: the stages whose loaders the call received.

    Raises:
        ConfigurationError: the call received the train DataLoader, which cannot be rebuilt.
    """
    if "train" in given_stages:
        raise ConfigurationError(
            "trainer.reset_train_dataloader(): fit() received the train DataLoader, which cannot be "
            "rebuilt. Provide train_dataloader() on the module or a DataModule instead."
        )
    old = loaders.get("train")
    rng = get_rng_states()  # preparing draws a seed; the old loader's is kept instead
    new = loaders["train"] = load_stage(trainer, "train", None, required=True)
    set_rng_states(rng)
    end_workers([old])
    if old is not None:
        new.load_state_dict(old.state_dict())


def _in_order(loader: DataLoader, name: str) -> DataLoader:
    """``loader`` reading its dataset in order (``overfit_batches``: the same batches each epoch).

    As Lightning, a sampler other than SequentialSampler is replaced, with a warning.
    """
    if (
        isinstance(loader.dataset, IterableDataset)
        or isinstance(loader.sampler, SequentialSampler)
        or loader.batch_size is None  # a custom batch_sampler: its order is the user's
    ):
        return loader
    warn_user(
        f"Trainer(overfit_batches=...): the {name} dataloader shuffles; it reads in order instead, "
        "so every epoch sees the same batches (as Lightning does)."
    )
    batches = BatchSampler(SequentialSampler(loader.dataset), loader.batch_size, loader.drop_last)
    return rebuild_loader(loader, batch_sampler=batches)
