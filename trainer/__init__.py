"""trainer: a PyTorch training framework.

``Trainer`` + ``TrainModule`` for a managed loop, ``Accelerator`` for your own loop; strategies,
precision, loggers and callbacks are constructor arguments. Importing this package imports torch
and the framework's own small modules only.
"""

from __future__ import annotations

from trainer import _old_paths
from trainer.accelerator.accelerator import Accelerator
from trainer.accelerator.data_loader import prepare_data_loader
from trainer.accelerator.launchers import debug_launcher, notebook_launcher, patch_environment
from trainer.accelerator.local_sgd import LocalSGD
from trainer.accelerator.memory import find_executable_batch_size, release_memory
from trainer.accelerator.model_wrappers import extract_model_from_parallel
from trainer.accelerator.operations import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    wait_for_everyone,
)
from trainer.accelerator.parallelism import ParallelismConfig
from trainer.accelerator.pipelining import prepare_pippy
from trainer.accelerator.process_logging import get_logger
from trainer.big_modeling.api import (
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
from trainer.big_modeling.quantization import BnbQuantizationConfig, load_and_quantize_model
from trainer.data.loader import skip_first_batches
from trainer.data.transfer import send_to_device
from trainer.errors import (
    AnomalyError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    ConfigurationError,
    HookResultError,
    MissingDependencyError,
    StrategyError,
    TrainerError,
)
from trainer.runtime.configs import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from trainer.runtime.engine_plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchDynamoPlugin,
)
from trainer.runtime.kwargs_handlers import (
    AORecipeKwargs,
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    TERecipeKwargs,
)
from trainer.runtime.seed import seed_everything, set_seed, synchronize_rng_states
from trainer.runtime.state import DistributedType, LoggerType, PartialState, PrecisionType
from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "AORecipeKwargs",
    "Accelerator",
    "AnomalyError",
    "AutocastKwargs",
    "BnbQuantizationConfig",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DataModule",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "HookResultError",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LocalSGD",
    "LoggerType",
    "MegatronLMPlugin",
    "MissingDependencyError",
    "ParallelismConfig",
    "PartialState",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "StrategyError",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
    "TrainModule",
    "Trainer",
    "TrainerError",
    "broadcast",
    "broadcast_object_list",
    "cpu_offload",
    "cpu_offload_with_hook",
    "debug_launcher",
    "disk_offload",
    "dispatch_model",
    "extract_model_from_parallel",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "get_logger",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_and_quantize_model",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "notebook_launcher",
    "pad_across_processes",
    "patch_environment",
    "prepare_data_loader",
    "prepare_pippy",
    "reduce",
    "release_memory",
    "seed_everything",
    "send_to_device",
    "set_seed",
    "skip_first_batches",
    "synchronize_rng_states",
    "wait_for_everyone",
]

_old_paths.install()
