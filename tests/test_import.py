"""``import trainer`` imports torch and the framework's own small modules only (DESIGN §1)."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = [
    "rich",
    "torchmetrics",
    "yaml",
    "tensorboard",
    "wandb",
    "mlflow",
    "deepspeed",
    "torch_xla",
    "megatron",
    "jsonargparse",
    "safetensors",
    "sklearn",
]


def test_import_trainer_loads_no_optional_package():
    code = (
        "import sys, json, trainer, trainer.callbacks, trainer.loggers, trainer.strategies, trainer.precision;"
        f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_public_names_of_design_section_4_are_exported():
    import trainer

    for name in [
        "Accelerator", "Trainer", "TrainModule", "DataModule", "PartialState", "DistributedType",
        "PrecisionType", "LoggerType", "ProjectConfiguration", "DataLoaderConfiguration",
        "GradientAccumulationPlugin", "find_executable_batch_size", "skip_first_batches",
        "seed_everything", "synchronize_rng_states", "TrainerError", "ConfigurationError",
        "CheckpointError", "StrategyError", "MissingDependencyError",
    ]:  # fmt: skip
        assert hasattr(trainer, name), name
    assert {m.name for m in trainer.DistributedType} >= {
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "FSDP",
        "DEEPSPEED",
        "XLA",
        "MEGATRON_LM",
    }
