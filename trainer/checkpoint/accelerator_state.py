"""The Accelerator's ``save_state`` / ``load_state`` / ``save_model``, in the checkpoint format.

``save_state`` writes every prepared model, optimizer, scheduler, dataloader position, the
precision plugin's state, registered objects and the RNG states as one checkpoint directory:
the core a Trainer checkpoint holds too (`trainer.checkpoint.training_state`), plus the
further models, the registered objects and the iteration.
With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the directories are
``<project_dir>/checkpoints/checkpoint_<N>`` and only ``total_limit`` are kept, the oldest removed
after the new one is complete.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.accelerate_folder import is_accelerate_folder, read_accelerate_folder
from trainer.checkpoint.atomic import (
    MANIFEST,
    discard_checkpoint,
    enclosing_checkpoint,
    fsync_directory,
    has_trainer_manifest,
    process_tag,
    remove_stale_temporaries,
    replace_directory,
)
from trainer.checkpoint.format import (
    EXTRA_DIR,
    EXTRA_FILES_KEY,
    write_model_files,
)
from trainer.checkpoint.manifest import allowing_extra_files
from trainer.checkpoint.training_state import (
    TrainingObjects,
    capture_training_state,
    load_model_state,
    load_states,
    loader_state_for_rank,
    rng_state_for_rank,
)
from trainer.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError
from trainer.runtime.seed import set_rng_states

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator
    from trainer.plugins import AsyncCheckpointIO

__all__ = [
    "CheckpointObjects",
    "check_model_directory",
    "load_accelerator_state",
    "save_accelerator_state",
    "save_model_weights",
]

_AUTO_NAME = re.compile(r"^checkpoint_(\d+)$")
# The weight files save_model (ours or Accelerate's) writes; an earlier save's are replaced, and
# every other entry of the folder is kept.
_WEIGHT_FILE = re.compile(
    r"model\.safetensors(\.index\.json)?|model-\d{5,}-of-\d{5,}\.safetensors"
    r"|pytorch_model\.bin(\.index\.json)?|pytorch_model-\d{5,}-of-\d{5,}\.bin"
)


@dataclass(frozen=True)
class CheckpointObjects:
    """What an Accelerator's ``save_state`` writes and ``load_state`` restores, in the order
    they were prepared or registered (the Accelerator hands over its own lists).

    Attributes:
        models: the prepared models (as prepared: possibly engine-wrapped).
        optimizers: the prepared optimizers.
        schedulers: the prepared schedulers.
        dataloaders: the prepared dataloaders.
        custom_objects: the objects given to ``register_for_checkpointing``.
        save_hooks: ``register_save_state_pre_hook``'s hooks, in order.
        load_hooks: ``register_load_state_pre_hook``'s hooks, in order.
    """

    models: Sequence[torch.nn.Module]
    optimizers: Sequence[Any]
    schedulers: Sequence[Any]
    dataloaders: Sequence[Any]
    custom_objects: Sequence[Any]
    save_hooks: Sequence[Callable[..., None]] = ()
    load_hooks: Sequence[Callable[..., None]] = ()


def _training_objects(accelerator: Accelerator, objects: CheckpointObjects) -> TrainingObjects:
    """The shared core's objects: the first model (unwrapped), optimizers, schedulers, loaders."""
    first = accelerator.unwrap_model(objects.models[0]) if objects.models else None
    return TrainingObjects(
        model=first,
        optimizers=objects.optimizers,
        schedulers=objects.schedulers,
        dataloaders=objects.dataloaders,
        precision=accelerator.precision,
    )


def _auto_dir(accelerator: Accelerator) -> Path:
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:
        raise ConfigurationError(
            "automatic_checkpoint_naming needs a project directory: Accelerator(project_dir=...) or ProjectConfiguration(project_dir=...)."
        )
    return Path(project_dir) / "checkpoints"


def _numbered(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), entry)
        for entry in directory.iterdir()
        if (m := _AUTO_NAME.match(entry.name))
    ]
    return sorted(found)


def save_accelerator_state(
    accelerator: Accelerator,
    output_dir: str | os.PathLike[str] | None,
    objects: CheckpointObjects,
    *,
    checkpoint_io: AsyncCheckpointIO | None = None,
) -> Path:
    """Write the Accelerator's whole state (in the background with ``checkpoint_io``); return
    the directory.

    Args:
        accelerator: whose strategy, precision and project configuration are used.
        output_dir: the directory; None with automatic checkpoint naming.
        objects: the Accelerator's prepared and registered objects.
        checkpoint_io: writes in the background when given.
    """
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        output = _auto_dir(accelerator) / f"checkpoint_{config.iteration}"
    elif output_dir is None:
        raise ConfigurationError(
            "save_state(): give a directory, or use ProjectConfiguration(automatic_checkpoint_naming=True) with a project_dir."
        )
    else:
        output = Path(output_dir)
    strategy = accelerator.strategy
    if checkpoint_io is not None:  # at most one save in flight: the previous one ends first
        checkpoint_io.wait()
    if config.automatic_checkpoint_naming:  # before anything runs or is written
        _check_is_newest(output.parent, config.iteration)
    if accelerator.is_main_process:  # what a killed save left beside it (dead writers' only)
        remove_stale_temporaries(output.parent)
    models = [accelerator.unwrap_model(model) for model in objects.models]
    # The first model and the optimizers keep the strategy's layout (DCP shards under FSDP's
    # SHARDED state dicts, written by every rank); further models are gathered in full.
    core = capture_training_state(strategy, _training_objects(accelerator, objects))
    first = core.pop("state_dict", {})
    others = [strategy.module_state_dict(model, full=True) for model in models[1:]]
    weights = [first, *others] if models else []  # a save hook may pop entries
    extra = _run_save_hooks(objects, weights, output) if objects.save_hooks else None
    checkpoint: dict[str, Any] = {
        **core,
        "state_dict": weights[0] if weights else {},
        "other_models": weights[1:],
        "num_models": len(weights),  # the first state dict may be held by an engine (DeepSpeed)
        "custom_objects": [obj.state_dict() for obj in objects.custom_objects],
        "iteration": config.iteration,
        "global_step": config.iteration,
        # Accelerate's `step`: batches into the accumulation count, so a resume mid-window
        # steps where the interrupted run would have
        "accumulation_step": accelerator.gradient_state.step,
    }
    if extra is not None:
        checkpoint[EXTRA_FILES_KEY] = os.fspath(extra)
    pending = None  # every process calls it; the strategy (or the background writer) writes
    if checkpoint_io is None:
        strategy.save_checkpoint(output, checkpoint)
    else:
        pending = checkpoint_io.save_checkpoint(checkpoint, output, strategy=strategy)
    if config.automatic_checkpoint_naming:
        config.iteration += 1
        if config.total_limit is not None and accelerator.is_main_process:
            limit = config.total_limit
            if pending is None:
                _prune(output.parent, limit, output)
            else:  # only once the new one is complete
                pending.then(lambda: _prune(output.parent, limit, output))
    return output


def _run_save_hooks(objects: CheckpointObjects, weights: list[Any], output: Path) -> Path | None:
    """Run the save hooks with a fresh folder beside ``output`` as their ``output_dir``; return
    it when they wrote something there (it becomes the checkpoint's ``extra/``), else None.
    They may pop entries of ``weights`` (models they save themselves)."""
    folder = output.parent / f".{output.name}.tmp-{process_tag()}"  # a stale one is cleaned up
    folder.mkdir(parents=True)
    try:
        for hook in objects.save_hooks:
            hook(list(objects.models), weights, os.fspath(folder))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if any(folder.iterdir()):
        return folder
    folder.rmdir()
    return None


def _check_is_newest(directory: Path, iteration: int) -> None:
    """Refuse to name a checkpoint ``checkpoint_<iteration>`` when that number or a higher one
    exists (a second run in the same project_dir starts at 0): it would replace a checkpoint,
    or be pruned first and passed over by ``load_state()``, which both go by number."""
    taken = [(number, path) for number, path in _numbered(directory) if number >= iteration]
    if not taken:
        return
    number, newest = taken[-1]
    clash = "would replace it" if number == iteration else "would not be the newest"
    raise CheckpointError(
        f"save_state(): automatic checkpoint naming would write checkpoint_{iteration} "
        f"(ProjectConfiguration.iteration={iteration}) in {directory}, but {newest.name} "
        f"exists there already, so the new checkpoint {clash} (total_limit pruning and "
        "load_state() go by number). To continue that run, call accelerator.load_state() "
        f"first (the next save is then checkpoint_{number + 1}); to keep its checkpoints and "
        f"start another run, set accelerator.project_configuration.iteration = {number + 1} "
        "or use another project_dir."
    )


def _prune(directory: Path, total_limit: int, newest: Path) -> None:
    """Delete the oldest ``checkpoint_<N>`` beyond ``total_limit``; never ``newest``, the
    checkpoint just written, nor an entry trainer did not write (a user's, Accelerate's), nor
    one a user added files to (`discard_checkpoint`)."""
    older = [
        path for _, path in _numbered(directory) if path != newest and has_trainer_manifest(path)
    ]
    for old in older[: max(0, len(older) + 1 - total_limit)]:
        # Renamed aside first (a kill never leaves half of one); kept if a user added files.
        discard_checkpoint(old, "ProjectConfiguration(total_limit)")


def load_accelerator_state(
    accelerator: Accelerator,
    input_dir: str | os.PathLike[str] | None,
    objects: CheckpointObjects,
    *,
    strict: bool = True,
) -> Path:
    """Restore what `save_accelerator_state` wrote (newest automatic one when None).

    Args:
        accelerator: whose strategy, precision and project configuration are used.
        input_dir: the directory; None: the newest automatically named one.
        objects: the Accelerator's prepared and registered objects, loaded in place.
        strict: False: model weights missing from the checkpoint, or not in the model, are
            skipped (``load_state_dict(strict=False)``).
    """
    config = accelerator.project_configuration
    number = None  # the automatic checkpoint's number, when loading the newest
    if input_dir is None:
        if not config.automatic_checkpoint_naming:
            raise ConfigurationError(
                "load_state(): give a directory, or use automatic_checkpoint_naming to load the newest."
            )
        existing = _numbered(_auto_dir(accelerator))
        if not existing:
            raise CheckpointNotFoundError(
                f"load_state(): no checkpoint_N directory in {_auto_dir(accelerator)}."
            )
        number, source = existing[-1]
    else:
        source = Path(input_dir)
    is_accelerate = is_accelerate_folder(source)
    if is_accelerate:  # written by Hugging Face Accelerate's save_state
        checkpoint = read_accelerate_folder(source, accelerator.process_index)
    else:  # verified (extra/ included) before a hook reads anything
        first = accelerator.unwrap_model(objects.models[0]) if objects.models else None
        with allowing_extra_files():  # a save hook's files (extra/) are expected here
            checkpoint = accelerator.strategy.load_checkpoint(source, first)
    models = list(objects.models)
    for hook in objects.load_hooks:  # a model a hook pops is loaded by the hook, not here
        hook(models, os.fspath(source if is_accelerate else source / EXTRA_DIR))
    states = [checkpoint["state_dict"], *checkpoint.get("other_models", [])]
    saved_models = checkpoint.get("num_models", len(states) if states[0] else 0)
    fix = "Prepare the same objects in the same order before loading."
    where = f"load_state({source})"
    if saved_models != len(models):
        raise CheckpointError(
            f"{where}: the checkpoint has {saved_models} models but {len(models)} are "
            f"prepared or registered now (after the load hooks). {fix}"
        )
    for model, state in zip(models, states, strict=False):
        load_model_state(
            accelerator.strategy, accelerator.unwrap_model(model), state, where, strict=strict
        )
    load_states(
        "optimizer_states", objects.optimizers, checkpoint.get("optimizer_states", []), where, fix
    )
    load_states(
        "lr_schedulers", objects.schedulers, checkpoint.get("lr_schedulers", []), where, fix
    )
    load_states(
        "custom_objects", objects.custom_objects, checkpoint.get("custom_objects", []), where, fix
    )
    for loader, state in zip(objects.dataloaders, checkpoint.get("dataloaders", []), strict=False):
        loader.load_state_dict(loader_state_for_rank(state, accelerator.process_index))
    accelerator.precision.load_state_dict(checkpoint.get("precision") or {})
    rng_state = rng_state_for_rank(checkpoint.get("rng_states"), accelerator.process_index)
    if rng_state is not None:
        set_rng_states(rng_state)
    if "accumulation_step" in checkpoint:  # older checkpoints: the count goes on as it was
        accelerator.gradient_state.step = checkpoint["accumulation_step"]
    if number is not None:  # numbering goes on after the folder's name, not a saved field
        config.iteration = number + 1
    return source


def check_model_directory(save_directory: str | os.PathLike[str]) -> Path:
    """The folder ``save_model`` may write into: not a file, not a trainer checkpoint, and not
    inside one (a new weight file would break its manifest). Returns it, links resolved.

    Raises:
        CheckpointError: naming the file or the checkpoint.
    """
    directory = Path(save_directory).resolve()
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"save_model: {directory} is a file; give a directory.")
    folder = enclosing_checkpoint(directory)
    if folder is not None:
        where = "is" if folder == directory else f"is inside {folder}, which is"
        raise CheckpointError(
            f"save_model: {directory} {where} a trainer checkpoint (its {MANIFEST} lists "
            "every file of it, so new weights there would break it). Save the model into "
            "another directory; load the checkpoint's weights with load_state or "
            "load_checkpoint_in_model."
        )
    return directory


def save_model_weights(
    state_dict: dict[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str,
    safe_serialization: bool,
) -> None:
    """Write model weights into ``save_directory`` (safetensors, sharded past ``max_shard_size``),
    atomically: the folder is built complete under a temporary sibling and swapped in, so a crash
    or a failed write leaves the previous save whole.

    The other entries of the folder (a config.json, a tokenizer, modeling_*.py) are kept
    (hard-linked into the new folder, not copied); an earlier save's weight files are not:
    ``model.safetensors``, ``model-0000i-of-0000N.safetensors``, ``model.safetensors.index.json``
    and their ``pytorch_model`` ``.bin`` counterparts.

    Raises:
        CheckpointError: the path is a file or a trainer checkpoint (`check_model_directory`),
            or a folder there has a weight file's name.
    """
    directory = check_model_directory(save_directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(directory.parent)  # what a killed save left (dead writers' only)
    staged = directory.parent / f".{directory.name}.tmp-{process_tag()}"
    staged.mkdir()
    try:
        if directory.is_dir():
            for entry in directory.iterdir():
                if not _is_weight_file(entry):
                    _link_into(entry, staged / entry.name)
        if safe_serialization:
            write_model_files(staged, state_dict, max_shard_size)
        else:
            weights = {k: v.contiguous() for k, v in state_dict.items()}
            with open(staged / "pytorch_model.bin", "wb") as file:
                torch.save(weights, file)
                file.flush()
                os.fsync(file.fileno())
        fsync_directory(staged)
        replace_directory(staged, directory)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _is_weight_file(entry: Path) -> bool:
    """Whether ``entry`` is an earlier save's weight file, which the new save replaces."""
    if _WEIGHT_FILE.fullmatch(entry.name) is None:
        return False
    if entry.is_dir() and not entry.is_symlink():  # kept, it would collide with the new file
        raise CheckpointError(
            f"save_model: {entry} is a folder with a weight file's name; save_model writes its "
            "weights there. Move or rename the folder, or save into another directory."
        )
    return True


def _link_into(source: Path, target: Path) -> None:
    """``source`` (a file or a folder) at ``target`` by hard links; copied where links fail."""
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(source, target)


def _link_or_copy(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)
