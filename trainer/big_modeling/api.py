"""The public functions of ``trainer.big_modeling`` in one import path, with Accelerate's call shapes.

Each lives in the module of its step:

- ``init_empty_weights`` / ``init_on_device``: ``trainer.big_modeling.empty_init``;
- ``infer_auto_device_map``, ``dispatch_model``, ``cpu_offload``, ``disk_offload``,
  ``cpu_offload_with_hook`` (and its ``UserCpuOffloadHook``): ``trainer.big_modeling.dispatch``;
- ``load_checkpoint_in_model`` / ``load_checkpoint_and_dispatch``:
  ``trainer.big_modeling.loading``.

Owns nothing else; ``trainer`` and ``trainer.big_modeling`` re-export these names from here.
"""

from __future__ import annotations

from trainer.big_modeling.dispatch import (
    UserCpuOffloadHook,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
)
from trainer.big_modeling.empty_init import init_empty_weights, init_on_device
from trainer.big_modeling.loading import load_checkpoint_and_dispatch, load_checkpoint_in_model

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
