"""Big models on small machines: build without memory, map to devices, load shard by shard, offload.

- ``api``: the public functions (``init_empty_weights``, ``dispatch_model``,
  ``load_checkpoint_and_dispatch``, ``cpu_offload`` ...), with Accelerate's call shapes.
- ``device_map``: the arithmetic of ``infer_auto_device_map`` (sizes, tied weights, budgets).
- ``offload``: the offload folder and the hooks that bring weights to the execution device.

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
