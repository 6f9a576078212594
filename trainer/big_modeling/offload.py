"""The offloading machinery's names in one import path (where ``trainer.cli`` and users find them).

Each lives in the module of its part:

- reading a checkpoint tensor by tensor (``weight_files``, ``StoredTensor``, ``iter_stored``,
  ``read_safetensors_header``): ``trainer.big_modeling.checkpoint_reader``;
- the offload folder and its index (``OFFLOAD_INDEX``, ``offload_tensor``,
  ``load_offload_index``, ``save_offload_index``, ``write_tensor_file``, ``WeightsMap``):
  ``trainer.big_modeling.offload_folder``;
- the forward hooks (``AlignDevicesHook``, ``ModelOffloadHook``, ``remove_hooks``,
  ``set_module_tensor``): ``trainer.big_modeling.hooks``; ``send_to_device``:
  ``trainer.data.transfer``;
- offloading a model (``stream_model``, ``named_tensors``, ``require_loaded``):
  ``trainer.big_modeling.streaming``;
- loading a checkpoint into a model (``load_weights``): ``trainer.big_modeling.loading``.

Owns nothing else; nothing inside ``trainer.big_modeling`` imports from here.
"""

from __future__ import annotations

from trainer.big_modeling.checkpoint_reader import (
    StoredTensor,
    iter_stored,
    read_safetensors_header,
    weight_files,
)
from trainer.big_modeling.hooks import (
    AlignDevicesHook,
    ModelOffloadHook,
    remove_hooks,
    set_module_tensor,
)
from trainer.big_modeling.loading import load_weights
from trainer.big_modeling.offload_folder import (
    OFFLOAD_INDEX,
    WeightsMap,
    load_offload_index,
    offload_tensor,
    save_offload_index,
    write_tensor_file,
)
from trainer.big_modeling.streaming import named_tensors, require_loaded, stream_model
from trainer.data.transfer import send_to_device

__all__ = [
    "OFFLOAD_INDEX",
    "AlignDevicesHook",
    "ModelOffloadHook",
    "StoredTensor",
    "WeightsMap",
    "iter_stored",
    "load_offload_index",
    "load_weights",
    "named_tensors",
    "offload_tensor",
    "read_safetensors_header",
    "remove_hooks",
    "require_loaded",
    "save_offload_index",
    "send_to_device",
    "set_module_tensor",
    "stream_model",
    "weight_files",
    "write_tensor_file",
]
