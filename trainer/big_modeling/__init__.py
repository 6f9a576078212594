"""Big models on small machines: build without memory, map to devices, load shard by shard, offload.

- ``empty_init``: ``init_empty_weights`` / ``init_on_device``, building modules without memory.
- ``device_map``: the arithmetic of ``infer_auto_device_map`` (sizes, tied weights, budgets).
- ``dispatch``: ``infer_auto_device_map``, ``dispatch_model``, ``cpu_offload``, ``disk_offload``,
  ``cpu_offload_with_hook``: placing a model and hooking what is offloaded.
- ``streaming``: which tensors of a model stream, from where, and which modules get a hook.
- ``hooks``: the forward hooks that bring inputs and weights to the execution device and back.
- ``offload_folder``: the offload folder, its ``index.json`` and ``WeightsMap``.
- ``loading``: ``load_checkpoint_in_model`` / ``load_checkpoint_and_dispatch``, tensor by tensor.
- ``checkpoint_reader``: the files behind a checkpoint (verified, confined) and each tensor in them.
- ``api`` and ``offload``: the public functions and the machinery's names, re-exported in one
  import path each.

May import: ``trainer.checkpoint`` (reading weight files safely) and the base modules. The
strategies use ``init_empty_weights``; nothing here knows of strategies or the layers above.
"""

from __future__ import annotations

from trainer.big_modeling.api import (
    UserCpuOffloadHook,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)

__all__ = [
    "UserCpuOffloadHook",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
]
