"""The Accelerator's checkpoint verbs: ``save_state``, ``load_state`` (and their pre hooks),
``register_for_checkpointing``, ``save``, ``save_model``.

`CheckpointAPI` is a base of `trainer.accelerator.Accelerator`. What goes into the directory
and how it is written and verified is ``trainer.checkpoint.accelerator_state``; this class only
checks arguments and waits for a background save where Accelerate's semantics need it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from trainer.errors import ConfigurationError

if TYPE_CHECKING:
    from trainer.checkpoint.accelerator_state import CheckpointObjects
    from trainer.plugins import AsyncCheckpointIO
    from trainer.runtime.configs import ProjectConfiguration

__all__ = ["CheckpointAPI"]


class CheckpointAPI:
    """Saving and restoring everything an Accelerator prepared or was given to track."""

    # set by the Accelerator's constructor, filled by prepare / register_for_checkpointing
    _checkpoint_io: AsyncCheckpointIO | None
    _models: list[torch.nn.Module]
    _optimizers: list[Any]
    _schedulers: list[Any]
    _dataloaders: list[Any]
    _custom_objects: list[Any]
    _save_state_pre_hooks: dict[int, Callable[..., None]]
    _load_state_pre_hooks: dict[int, Callable[..., None]]
    is_main_process: bool
    is_local_main_process: bool
    project_configuration: ProjectConfiguration

    get_state_dict: Callable[..., dict[str, torch.Tensor]]  # the Accelerator's
    wait_for_everyone: Callable[[], None]  # ProcessAPI's

    # ---- checkpoints --------------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        *,
        checkpoint_io: AsyncCheckpointIO | None = None,
    ) -> str:
        """Save every prepared object, registered object and RNG state to ``output_dir``.

        The directory is a checkpoint (see docs/checkpointing.md), written atomically. With
        ``ProjectConfiguration(automatic_checkpoint_naming=True)`` it is
        ``<project_dir>/checkpoints/checkpoint_<N>`` and the oldest beyond ``total_limit`` are
        removed after the new one is complete. Returns the directory.

        With ``checkpoint_io=trainer.plugins.AsyncCheckpointIO()`` the state is copied to host
        memory and written in the background: the call returns at once, the directory appears
        (and ``total_limit`` pruning runs) once it is complete. The next ``save_state``,
        ``load_state``, ``end_training`` and ``checkpoint_io.wait()`` wait for it and raise its
        failure (a ``CheckpointError`` naming the directory).
        """
        from trainer.checkpoint.accelerator_state import save_accelerator_state

        if checkpoint_io is not None:
            self._checkpoint_io = checkpoint_io
        objects = self._checkpoint_objects()
        return os.fspath(
            save_accelerator_state(self, output_dir, objects, checkpoint_io=checkpoint_io)
        )

    def load_state(self, input_dir: str | os.PathLike[str] | None = None) -> str:
        """Restore what ``save_state`` wrote (the newest automatic checkpoint when None).

        Prepare (and register) the same objects in the same order first. Returns the directory.
        """
        from trainer.checkpoint.accelerator_state import load_accelerator_state

        if self._checkpoint_io is not None:  # a background save_state completes first
            self._checkpoint_io.wait()
        return os.fspath(load_accelerator_state(self, input_dir, self._checkpoint_objects()))

    def _checkpoint_objects(self) -> CheckpointObjects:
        """The prepared and registered objects, in order (the lists themselves, not copies)."""
        from trainer.checkpoint.accelerator_state import CheckpointObjects

        return CheckpointObjects(
            models=self._models,
            optimizers=self._optimizers,
            schedulers=self._schedulers,
            dataloaders=self._dataloaders,
            custom_objects=self._custom_objects,
            save_hooks=list(self._save_state_pre_hooks.values()),
            load_hooks=list(self._load_state_pre_hooks.values()),
        )

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in ``save_state`` before it writes.

        ``models`` are the prepared models, ``weights`` their state dicts (a list the hook may
        shorten: a weight it pops is not written, as in Accelerate, for a model it saves its own
        way), and ``output_dir`` the checkpoint's ``extra/`` folder: files written there become
        part of the checkpoint, listed and hashed in its manifest, appearing atomically with the
        rest (write them on the main process). This package never reads them; the load hook does.
        Returns a handle whose ``remove()`` unregisters the hook.
        """
        handle = RemovableHandle(self._save_state_pre_hooks)
        self._save_state_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in ``load_state`` once the checkpoint is verified,
        before the states are loaded.

        ``input_dir`` is the checkpoint's ``extra/`` folder (what the save hook wrote; for a
        folder written by Hugging Face Accelerate, the folder itself); a model the hook pops from
        ``models`` is not loaded by ``load_state``. Returns a handle whose ``remove()``
        unregisters the hook.
        """
        handle = RemovableHandle(self._load_state_pre_hooks)
        self._load_state_pre_hooks[handle.id] = hook
        return handle

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include ``objects`` (each with ``state_dict`` / ``load_state_dict``) in ``save_state``."""
        invalid = [
            f"{i}: {type(o).__name__}"
            for i, o in enumerate(objects)
            if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))
        ]
        if invalid:
            raise ConfigurationError(
                f"register_for_checkpointing: these objects have no state_dict/load_state_dict: {invalid}. Give them both methods."
            )
        self._custom_objects.extend(objects)

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Accelerate's replacement for ``torch.save``: write ``obj`` to the file ``f`` from the
        main process only (from each machine's with ``ProjectConfiguration(save_on_each_node=
        True)``), with ``torch.save``, or as safetensors with ``safe_serialization=True`` (``obj``
        a dict of tensors). Unlike Accelerate, atomically: a crash leaves the previous file or
        none, never part of one.

        Raises:
            CheckpointError: the file could not be written.
        """
        from trainer.checkpoint.atomic import atomic_write

        on_each_node = self.project_configuration.save_on_each_node
        if not (self.is_local_main_process if on_each_node else self.is_main_process):
            return
        if safe_serialization:
            from safetensors.torch import save

            data = save(obj, metadata={"format": "pt"})
            atomic_write(f, lambda file: file.write(data))
        else:
            atomic_write(f, lambda file: torch.save(obj, file))

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write ``model``'s weights (unwrapped, gathered) to ``save_directory`` on the main process.

        ``model.safetensors``, or ``model-0000i-of-0000N.safetensors`` plus
        ``model.safetensors.index.json`` beyond ``max_shard_size`` (e.g. "10GB", "500MB").
        """
        from trainer.checkpoint.accelerator_state import save_model_weights

        state_dict = self.get_state_dict(model)
        if self.is_main_process:
            save_model_weights(
                state_dict,
                save_directory,
                max_shard_size=max_shard_size,
                safe_serialization=safe_serialization,
            )
        self.wait_for_everyone()
