"""The Accelerator's checkpoint verbs: ``save_state``, ``load_state`` (and their pre hooks),
``register_for_checkpointing``, ``save``, ``save_model``, ``unwrap_model``, ``get_state_dict``.

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

from trainer.accelerator.model_wrappers import remove_autocast_forward
from trainer.errors import ConfigurationError

if TYPE_CHECKING:
    from trainer.checkpoint.accelerator_state import CheckpointObjects
    from trainer.plugins import AsyncCheckpointIO
    from trainer.runtime.configs import ProjectConfiguration
    from trainer.strategies import Strategy

# Accelerate's load_state(map_location=...) values. Here weights load onto the model's own
# device and torch's Optimizer.load_state_dict moves optimizer state to its parameter's, so
# each gives the same result.
_MAP_LOCATIONS = (None, "cpu", "on_device")
# torch.load options Accelerate passes through load_state(load_kwargs=...). Nothing is
# unpickled from this package's format; an Accelerate folder's pickles are always read with
# weights_only=True (a crafted one never runs code), so these change nothing.
_LOAD_KWARGS = ("map_location", "weights_only", "mmap")

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

    strategy: Strategy
    wait_for_everyone: Callable[[], None]  # ProcessAPI's

    # ---- checkpoints --------------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        *,
        checkpoint_io: AsyncCheckpointIO | None = None,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save every prepared object, registered object and RNG state to ``output_dir``.

        The directory is a checkpoint (see docs/checkpointing.md), written atomically. With
        ``ProjectConfiguration(automatic_checkpoint_naming=True)`` it is
        ``<project_dir>/checkpoints/checkpoint_<N>`` and the oldest beyond ``total_limit`` are
        removed after the new one is complete (only folders this package wrote, never the new
        one). Returns the directory.

        With ``checkpoint_io=trainer.plugins.AsyncCheckpointIO()`` the state is copied to host
        memory and written in the background: the call returns at once, the directory appears
        (and ``total_limit`` pruning runs) once it is complete. The next ``save_state``,
        ``load_state``, ``end_training`` and ``checkpoint_io.wait()`` wait for it and raise its
        failure (a ``CheckpointError`` naming the directory).

        ``save_model_func_kwargs`` go to DeepSpeed's or Megatron's own ``save_checkpoint`` in
        Accelerate; every engine here writes this package's format, so any is refused.

        Raises:
            ConfigurationError: no directory and no automatic naming, or a keyword is given.
            CheckpointError: with automatic naming, ``checkpoint_<j>`` with ``j`` at least
                ``project_configuration.iteration`` exists (another run's): the new one would
                replace it or not be the newest. Call ``load_state()`` first, set ``iteration``
                past it, or use another project_dir.
        """
        from trainer.checkpoint.accelerator_state import save_accelerator_state

        if save_model_func_kwargs:
            raise ConfigurationError(
                f"save_state(..., {', '.join(sorted(save_model_func_kwargs))}=...): Accelerate "
                "passes these to DeepSpeed's or Megatron's own save_checkpoint; here every "
                "engine writes the trainer checkpoint format, which takes no such options. "
                "Remove them."
            )
        if checkpoint_io is not None:
            self._checkpoint_io = checkpoint_io
        objects = self._checkpoint_objects()
        return os.fspath(
            save_accelerator_state(self, output_dir, objects, checkpoint_io=checkpoint_io)
        )

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> str:
        """Restore what ``save_state`` wrote (the newest automatic checkpoint when None).

        Prepare (and register) the same objects in the same order first. Returns the directory.
        As in Accelerate, ``strict=False`` loads model weights whose names do not all match
        (missing and unexpected keys are skipped; a differently shaped tensor is still an
        error), and ``map_location`` may be None, ``"cpu"`` or ``"on_device"`` (weights always
        land on the model's device here). ``load_kwargs`` (Accelerate's ``torch.load`` options)
        may hold ``map_location``, ``weights_only`` and ``mmap``, which change nothing: no
        pickle is read from this format, and an Accelerate folder's are always read with
        ``weights_only=True``.

        Raises:
            ConfigurationError: another option, or another ``map_location``.
        """
        from trainer.checkpoint.accelerator_state import load_accelerator_state

        strict = load_model_func_kwargs.pop("strict", True)
        map_location = load_model_func_kwargs.pop("map_location", None)
        unknown = sorted(load_model_func_kwargs) + [
            f"load_kwargs[{key!r}]" for key in sorted(load_kwargs or {}) if key not in _LOAD_KWARGS
        ]
        if unknown:
            raise ConfigurationError(
                f"load_state() does not take {', '.join(unknown)} here. It takes strict= and "
                "map_location= for the models, and load_kwargs with "
                f"{', '.join(_LOAD_KWARGS)} (torch.load's, which no part of this format needs)."
            )
        if map_location not in _MAP_LOCATIONS:
            raise ConfigurationError(
                f"load_state(map_location={map_location!r}): use None, 'cpu' or 'on_device' "
                "(as in Accelerate)."
            )
        if self._checkpoint_io is not None:  # a background save_state completes first
            self._checkpoint_io.wait()
        return os.fspath(
            load_accelerator_state(self, input_dir, self._checkpoint_objects(), strict=bool(strict))
        )

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
        An earlier save's weight files there are replaced; the folder's other files are kept.
        As in Accelerate, no barrier: where the engine needs no collective to gather the weights
        (one process, DDP) it may be called under ``if accelerator.is_main_process:``; call
        ``wait_for_everyone()`` before another process reads the folder. Under FSDP, DeepSpeed
        ZeRO-3 and Megatron every process must call it (the weights are gathered).

        Raises:
            CheckpointError: ``save_directory`` is a file, or a trainer checkpoint (or inside
                one), checked on every process before the weights are gathered.
        """
        from trainer.checkpoint.accelerator_state import check_model_directory, save_model_weights

        check_model_directory(save_directory)
        state_dict = self.get_state_dict(model)
        if self.is_main_process:
            save_model_weights(
                state_dict,
                save_directory,
                max_shard_size=max_shard_size,
                safe_serialization=safe_serialization,
            )

    def get_state_dict(
        self, model: torch.nn.Module, unwrap: bool = True
    ) -> dict[str, torch.Tensor]:
        """The full state dict of ``model`` (gathered by the strategy when sharded)."""
        module = self.unwrap_model(model) if unwrap else model
        return self.strategy.module_state_dict(module, full=True)

    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = False,
    ) -> torch.nn.Module:
        """The user's module inside compile, engine and autocast wrappers.

        ``keep_torch_compile=True`` returns the compiled wrapper around it instead (its state
        dict's names start with ``_orig_mod.``), as Accelerate does by default.

        Raises:
            ConfigurationError: ``keep_torch_compile=True`` where an engine (DDP, FSDP, ...)
                sits between the compiled wrapper and the module.
        """
        inner = getattr(model, "_orig_mod", None)  # torch.compile's wrapper holds the module
        module = self.strategy.unwrap_module(model if inner is None else inner)
        if not keep_fp32_wrapper:
            remove_autocast_forward(module)
        if inner is None or not keep_torch_compile:
            return module
        if inner is not module:
            raise ConfigurationError(
                f"unwrap_model(keep_torch_compile=True): the compiled model wraps "
                f"{type(inner).__name__}, not your {type(module).__name__}, so no compiled "
                "wrapper of your module exists. Use keep_torch_compile=False (the default)."
            )
        return model
