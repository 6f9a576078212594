"""What the Trainer puts in a checkpoint and how it takes it back; where ``ckpt_path`` points.

The Trainer calls `dump_checkpoint` / `restore_from`; the file format lives in
``trainer/checkpoint/``, and so does the core this checkpoint shares with an Accelerator's
``save_state`` (`trainer.checkpoint.training_state`: optimizers, schedulers, precision, the
loader's position, RNG states). A restore loads into the Trainer's public objects (module, optimizers,
callbacks, the train loader...) and hands back what the Trainer keeps for later (`Resumed`).
A checkpoint holds the model, optimizers, schedulers, precision state, the progress (epoch,
global step, batch position), the train loader's seed (and a torchdata StatefulDataLoader's
position on every process), the RNG states, the callbacks', datamodule's and loggers' state,
and the hyperparameters.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint import find_latest_checkpoint, load_weights_file
from trainer.checkpoint.atomic import MANIFEST, has_trainer_manifest
from trainer.checkpoint.format import read_state, verify_checkpoint
from trainer.checkpoint.manifest import read_manifest
from trainer.checkpoint.training_state import (
    TrainingObjects,
    capture_training_state,
    load_model_state,
    load_state_into,
    load_states,
    loader_state_for_rank,
    rng_state_for_rank,
)
from trainer.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError, describe

if TYPE_CHECKING:
    from trainer.plugins.async_checkpoint import PendingSave
    from trainer.trainer.hook_table import HookTable
    from trainer.trainer.trainer import Trainer

__all__ = [
    "OpenedCheckpoint",
    "Resumed",
    "checkpoint_dir",
    "default_eval_ckpt_path",
    "dump_checkpoint",
    "load_checkpoint",
    "open_checkpoint",
    "resolve_ckpt_path",
    "restore_checkpoint",
    "restore_from",
]

_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Resumed:
    """What a checkpoint restored for ``fit`` hands back to the Trainer.

    Attributes:
        callback_metrics: the checkpoint's ``callback_metrics``, shown until logged anew.
        rng_state: this process's saved RNG states, applied when training starts (None when
            the checkpoint has none).
    """

    callback_metrics: dict[str, float]
    rng_state: dict[str, Any] | None


def checkpoint_dir(trainer: Trainer) -> Path:
    """Where checkpoints live: the ModelCheckpoint's ``dirpath``, else ``<root>/checkpoints``."""
    callback = trainer.checkpoint_callback
    dirpath = getattr(callback, "dirpath", None)
    return Path(dirpath) if dirpath else Path(trainer.default_root_dir) / "checkpoints"


def dump_checkpoint(trainer: Trainer, *, weights_only: bool = False) -> dict[str, Any]:
    """The checkpoint dict of the current state (before ``on_save_checkpoint`` hooks)."""
    module = trainer.module
    checkpoint: dict[str, Any] = {
        "trainer_checkpoint_version": _VERSION,
        "epoch": trainer.progress.epoch,
        "global_step": trainer.progress.global_step,
        "state_dict": trainer.strategy.module_state_dict(module, full=False),
        "hyper_parameters": dict(module.hparams),
    }
    _add_hparams_name(checkpoint, "hparams_name", module)
    if weights_only:
        return checkpoint
    train_loader = trainer.train_dataloader
    core = capture_training_state(
        trainer.strategy,
        TrainingObjects(
            model=None,  # the weights are above, with or without the rest
            optimizers=trainer.optimizers,
            schedulers=[config.scheduler for config in trainer.lr_scheduler_configs],
            dataloaders=[train_loader] if train_loader is not None else [],
            precision=trainer.precision_plugin,
        ),
    )
    loader_states = core.pop("dataloaders")
    core.pop("state_dict")
    checkpoint.update(
        core,
        progress=dataclasses.asdict(trainer.progress),
        callbacks={callback.state_key: callback.state_dict() for callback in trainer.callbacks},
        datamodule=trainer.datamodule.state_dict() if trainer.datamodule is not None else None,
        datamodule_hyper_parameters=(
            dict(trainer.datamodule.hparams) if trainer.datamodule is not None else None
        ),
        loops={"train_loader": loader_states[0] if loader_states else None},
        loggers=[{"class": type(lg).__name__, **lg.state_dict()} for lg in trainer.loggers],
        callback_metrics={
            k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1
        },
    )
    _add_hparams_name(checkpoint, "datamodule_hparams_name", trainer.datamodule)
    return checkpoint


def _add_hparams_name(checkpoint: dict[str, Any], key: str, owner: Any) -> None:
    """Lightning's ``hparams_name``: the ``__init__`` argument the hyperparameters came in as
    (one dict or Namespace), or "kwargs"; `load_from_checkpoint` passes them back by it."""
    name = getattr(owner, "_hparams_name", None) if owner is not None else None
    if isinstance(name, str) and owner.hparams:
        checkpoint[key] = name


def default_eval_ckpt_path(
    trainer: Trainer, module: Any, ckpt_path: str | os.PathLike[str] | None, stage: str
) -> str | os.PathLike[str] | None:
    """Lightning's rule for ``validate`` / ``test`` / ``predict`` called without a module after
    one was attached (``trainer.fit(model, ...)`` then ``trainer.test(datamodule=dm)``): with no
    ``ckpt_path`` they use the best checkpoint of the previous fit, and warn.

    Raises:
        ConfigurationError: that case, and the Trainer has no ModelCheckpoint (Lightning raises
            too), so the weights to use are not known.
    """
    if module is not None or ckpt_path is not None or trainer.module is None:
        return ckpt_path
    if trainer.checkpoint_callback is None:
        raise ConfigurationError(
            f"trainer.{stage}() without a module uses the best checkpoint of the previous fit "
            "(as in Lightning), but this Trainer has no ModelCheckpoint. Pass the module to "
            f"use its current weights, trainer.{stage}(module, ...), or a ckpt_path."
        )
    warnings.warn(
        f"trainer.{stage}(ckpt_path=None) was called without a module: the best checkpoint of "
        f"the previous fit is used, as in Lightning. Pass ckpt_path='best' or 'last', or the "
        "module to use its current weights, to silence this.",
        stacklevel=3,
    )
    return "best"


def resolve_ckpt_path(
    trainer: Trainer, ckpt_path: str | os.PathLike[str] | None, stage: str
) -> Path | None:
    """A concrete path for ``ckpt_path`` ("last", "best", a path or None).

    "last" with no checkpoint yet warns and returns None (a fresh start), so a job script can
    always pass it; "best" needs a ModelCheckpoint that has saved one.

    Raises:
        ConfigurationError: ``ckpt_path`` is not None, a str or an ``os.PathLike``; or "best"
            with no best checkpoint known.
        CheckpointError: the path does not exist.
    """
    if ckpt_path is None:
        return None
    if not isinstance(ckpt_path, str | os.PathLike) or isinstance(os.fspath(ckpt_path), bytes):
        raise ConfigurationError(
            f"{stage}(ckpt_path=...): expected None, 'last', 'best' or a path (str or "
            f"os.PathLike); received {describe(ckpt_path)}. Pass the checkpoint folder's path, "
            "e.g. ckpt_path='checkpoints/epoch=2-step=300'."
        )
    if ckpt_path == "last":
        latest = _newest_checkpoint(trainer)
        if latest is None:
            then = "starting from scratch" if stage == "fit" else "using the module's weights"
            warnings.warn(
                f"{stage}(ckpt_path='last'): no checkpoint in {checkpoint_dir(trainer)} yet; "
                f"no checkpoint will be loaded, {then}.",
                stacklevel=3,
            )
        return latest
    if ckpt_path == "best":
        best = getattr(trainer.checkpoint_callback, "best_model_path", "")
        if not best:
            raise ConfigurationError(
                f"{stage}(ckpt_path='best'): no best checkpoint is known. Add a ModelCheckpoint with a monitor and fit first, or pass a path."
            )
        return Path(best)
    path = Path(ckpt_path)
    if not path.exists():
        raise CheckpointNotFoundError(
            f"{stage}(ckpt_path={os.fspath(ckpt_path)!r}): no such file or directory."
        )
    return path


def _newest_checkpoint(trainer: Trainer) -> Path | None:
    """``ckpt_path="last"``: the most recently written valid checkpoint of every checkpoint
    callback (each ModelCheckpoint's ``dirpath``, an OnExceptionCheckpoint's folder), as
    Lightning takes the newest of their ``last`` files; without one, ``<root>/checkpoints``."""
    from trainer.callbacks.model_checkpoint import ModelCheckpoint, OnExceptionCheckpoint

    default = Path(trainer.default_root_dir) / "checkpoints"
    folders = [
        Path(callback.dirpath or default)
        for callback in trainer.callbacks
        if isinstance(callback, ModelCheckpoint)
    ] or [default]
    found = [find_latest_checkpoint(folder) for folder in dict.fromkeys(folders)]
    for callback in trainer.callbacks:
        if isinstance(callback, OnExceptionCheckpoint) and Path(callback.ckpt_path).is_dir():
            try:
                verify_checkpoint(callback.ckpt_path)
            except CheckpointError as err:
                warnings.warn(f"skipping {callback.ckpt_path}: {err}", stacklevel=4)
                continue
            found.append(Path(callback.ckpt_path))
    written = [(read_manifest(path).get("created", ""), path) for path in found if path is not None]
    return max(written)[1] if written else None


def load_checkpoint(trainer: Trainer, path: Path) -> dict[str, Any]:
    """Read a checkpoint directory (verified) or a single weights file."""
    return (
        trainer.strategy.load_checkpoint(path, trainer.module)
        if path.is_dir()
        else load_weights_file(path)
    )


@dataclasses.dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint resolved and opened before the dataloaders (`open_checkpoint`).

    Attributes:
        path: where it is.
        checkpoint: the whole checkpoint dict; None for a directory ``fit`` reads whole only
            after configuring the optimizers, which a sharded engine loads its shards into.
    """

    path: Path
    checkpoint: dict[str, Any] | None


def open_checkpoint(
    trainer: Trainer, ckpt_path: str | os.PathLike[str] | None, stage: str
) -> OpenedCheckpoint | None:
    """Resolve ``ckpt_path`` (see `resolve_ckpt_path`; for fit without one,
    `OnExceptionCheckpoint`'s) and restore the DataModule's state at once, before the Trainer
    asks it for dataloaders (as Lightning, so state from an earlier run shapes them); None when
    there is no checkpoint.

    ``validate`` / ``test`` / ``predict`` read the whole checkpoint here; ``fit`` reads only
    the verified ``state.json`` of a directory (`trainer.checkpoint.format.read_state`) and the
    rest after the optimizers exist (`restore_from`)."""
    if stage == "fit" and ckpt_path is None:
        ckpt_path = _checkpoint_after_an_exception(trainer)
    path = resolve_ckpt_path(trainer, ckpt_path, stage)
    trainer.ckpt_path = None if path is None else os.fspath(path)
    if path is None:
        return None
    is_read_later = stage == "fit" and path.is_dir()
    checkpoint = None if is_read_later else load_checkpoint(trainer, path)
    datamodule = trainer.datamodule
    if datamodule is not None:
        saved = read_state(path) if checkpoint is None else checkpoint
        # a Lightning .ckpt keeps it under the DataModule's class name
        state = saved.get("datamodule", saved.get(type(datamodule).__qualname__))
        if state is not None:
            load_state_into(datamodule, state, "ckpt_path", "datamodule does")
    return OpenedCheckpoint(path, checkpoint)


def restore_from(
    trainer: Trainer, opened: OpenedCheckpoint | None, stage: str, hooks: HookTable
) -> Resumed | None:
    """Restore ``opened`` for ``stage`` (its DataModule state is already back): for "fit" the
    whole training state, read now if `open_checkpoint` left it; otherwise the weights and the
    callbacks' states. What `restore_checkpoint` returns (None: no checkpoint, or not fit)."""
    if opened is None:
        return None
    checkpoint = opened.checkpoint
    if checkpoint is None:
        checkpoint = load_checkpoint(trainer, opened.path)
    return restore_checkpoint(trainer, checkpoint, hooks, full=stage == "fit")


def _checkpoint_after_an_exception(trainer: Trainer) -> Path | None:
    """Lightning's rule for ``fit(ckpt_path=None)`` with an `OnExceptionCheckpoint`: resume from
    the newest of the checkpoints it and the ModelCheckpoints' ``save_last`` wrote, so a script
    run again after a crash goes on from there (None when there is none: a fresh start)."""
    from trainer.callbacks.model_checkpoint import ModelCheckpoint, OnExceptionCheckpoint

    candidates = [
        Path(callback.ckpt_path)
        for callback in trainer.callbacks
        if isinstance(callback, OnExceptionCheckpoint)
    ]
    if not candidates:
        return None
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.save_last:
            folder = callback.dirpath or checkpoint_dir(trainer)
            candidates.append(Path(folder) / callback.CHECKPOINT_NAME_LAST)
    written = [
        ((path / MANIFEST).stat().st_mtime_ns, path)
        for path in candidates
        if has_trainer_manifest(path)  # a folder of ours, not a user's or a half-written one
    ]
    if not written:
        return None
    newest = max(written)[1]
    warnings.warn(
        f"fit(ckpt_path=None) with an OnExceptionCheckpoint resumes from the newest checkpoint "
        f"it or save_last wrote, {newest}, as in Lightning. Pass ckpt_path to choose another.",
        stacklevel=4,
    )
    return newest


def restore_checkpoint(
    trainer: Trainer, checkpoint: dict[str, Any], hooks: HookTable, *, full: bool
) -> Resumed | None:
    """Put ``checkpoint`` back: weights always; with ``full`` the whole training state.

    Args:
        trainer: the Trainer whose module, optimizers, callbacks... receive the state.
        checkpoint: the checkpoint dict.
        hooks: the call's hooks (``on_load_checkpoint`` runs first).
        full: restore the training state too (``fit``).

    Returns:
        What the Trainer keeps for later; None when only the weights were restored.
    """
    if full:
        _check_resumable(trainer, checkpoint)
    module = trainer.module
    hooks.call("on_load_checkpoint", checkpoint)
    load_model_state(
        trainer.strategy, module, checkpoint["state_dict"], "ckpt_path", module.strict_loading
    )
    if not full:
        _restore_callbacks(trainer, checkpoint)  # for every stage, as Lightning does
        return None
    load_states(
        "optimizer_states",
        trainer.optimizers,
        checkpoint.get("optimizer_states") or [],
        "ckpt_path",
        "Resume with the same configure_optimizers.",
    )
    # As Lightning: schedulers pair up with the saved states as far as both go.
    for index, (config, state) in enumerate(
        zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", []), strict=False)
    ):
        load_state_into(config.scheduler, state, "ckpt_path", f"lr_schedulers[{index}] does")
    load_state_into(
        trainer.precision_plugin, checkpoint.get("precision") or {}, "ckpt_path", "precision does"
    )
    progress = checkpoint["progress"]
    trainer.progress.epoch = progress["epoch"]
    trainer.progress.global_step = progress["global_step"]
    trainer.progress.batch_idx = progress["batch_idx"]
    trainer.progress.last_val_step = progress.get("last_val_step", -1)
    # Checkpoints written before these counters existed: automatic optimization's values.
    trainer.progress.total_batches = _count(progress, "total_batches", progress["global_step"])
    trainer.progress.batches_stepped = _count(progress, "batches_stepped", progress["global_step"])
    trainer.progress.is_epoch_ending = _flag(progress, "is_epoch_ending")
    _restore_callbacks(trainer, checkpoint)
    loader_state = (checkpoint.get("loops") or {}).get("train_loader")
    train_loader = trainer.train_dataloader
    if loader_state is not None and train_loader is not None:
        train_loader.load_state_dict(loader_state_for_rank(loader_state, trainer.global_rank))
    for logger, state in zip(trainer.loggers, checkpoint.get("loggers") or [], strict=False):
        if state.get("class") == type(logger).__name__:
            load_state_into(logger, state, "ckpt_path", "logger state does")
    return Resumed(
        callback_metrics=dict(checkpoint.get("callback_metrics") or {}),
        rng_state=rng_state_for_rank(checkpoint.get("rng_states"), trainer.global_rank),
    )


def _check_resumable(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """Refuse, before anything is loaded, what Lightning refuses to resume fit from.

    Raises:
        CheckpointError: the checkpoint holds the weights only (``save_weights_only``).
        ConfigurationError: its epoch is past ``max_epochs``.
    """
    if "progress" not in checkpoint:
        raise CheckpointError(
            f"fit(ckpt_path={trainer.ckpt_path!r}): the checkpoint holds the weights only "
            "(save_weights_only=True, or a weights file), not the optimizer state and position "
            "fit resumes from. To train from these weights, load them into the module "
            "(Module.load_from_checkpoint(path)) and call fit without ckpt_path."
        )
    epoch, max_epochs = checkpoint["progress"]["epoch"], trainer.max_epochs
    if max_epochs is not None and max_epochs != -1 and epoch > max_epochs:
        raise ConfigurationError(
            f"fit(ckpt_path={trainer.ckpt_path!r}): the checkpoint is at current_epoch={epoch}, "
            f"past Trainer(max_epochs={max_epochs}). Raise max_epochs to train on from it."
        )


def _restore_callbacks(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    callback_states = checkpoint.get("callbacks") or {}
    for callback in trainer.callbacks:
        key = callback.state_key
        if key not in callback_states:  # a checkpoint of an earlier trainer version
            key = getattr(callback, "legacy_state_key", key)
        if key in callback_states:
            what = f"callbacks[{key!r}] does"
            load_state_into(callback, callback_states[key], "ckpt_path", what)


def _count(progress: dict[str, Any], key: str, default: int) -> int:
    """``progress[key]``, a count (an int >= 0); ``default`` when the checkpoint has none.

    Raises:
        CheckpointError: the value is not an int >= 0.
    """
    if key not in progress:
        return default
    value = progress[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(
            f"the checkpoint's progress.{key} is {describe(value)}; expected an int >= 0. The "
            "checkpoint was edited or written by another program: resume from another one."
        )
    return value


def _flag(progress: dict[str, Any], key: str) -> bool | None:
    """``progress[key]``, a bool; None when the checkpoint has none (written before it existed).

    Raises:
        CheckpointError: the value is not a bool.
    """
    value = progress.get(key)
    if value is not None and not isinstance(value, bool):
        raise CheckpointError(
            f"the checkpoint's progress.{key} is {describe(value)}; expected True or False. The "
            "checkpoint was edited or written by another program: resume from another one."
        )
    return value


def save_checkpoint(
    trainer: Trainer,
    hooks: HookTable | None,
    filepath: str | os.PathLike[str],
    *,
    weights_only: bool = False,
) -> PendingSave | None:
    """What `Trainer.save_checkpoint` does: the pending step row to the loggers, the checkpoint
    dict, ``on_save_checkpoint``, then the write (in the background during fit with
    ``AsyncCheckpointIO``, after the save in flight ends)."""
    if trainer.module is None or hooks is None:
        raise ConfigurationError(
            "trainer.save_checkpoint: no module is attached. Call trainer.fit(module, ...) first."
        )
    checkpoint_io = trainer.checkpoint_io
    if checkpoint_io is not None:  # at most one save in flight: the previous ends first
        checkpoint_io.wait()
    fit_loop = trainer.fit_loop
    if getattr(fit_loop, "is_step_row_due", False):  # the row the checkpoint covers
        fit_loop.send_step_row()  # goes to the loggers first
    checkpoint = dump_checkpoint(trainer, weights_only=weights_only)
    hooks.call("on_save_checkpoint", checkpoint)
    if checkpoint_io is not None:
        is_fitting = trainer.state.stage == "fit" and trainer.state.status == "running"
        return checkpoint_io.save_checkpoint(
            checkpoint, filepath, strategy=trainer.strategy, in_background=is_fitting
        )
    trainer.strategy.save_checkpoint(filepath, checkpoint)
    return None
