"""Callbacks: observe the Trainer through its public attributes and hooks only.

Classes are imported on first use, so ``import trainer`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback, Checkpoint

if TYPE_CHECKING:
    from trainer.callbacks.batch_size_finder import BatchSizeFinder
    from trainer.callbacks.device_stats import DeviceStatsMonitor
    from trainer.callbacks.early_stopping import EarlyStopping
    from trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
    from trainer.callbacks.fit_summary import FitSummary
    from trainer.callbacks.gradient_accumulation import GradientAccumulationScheduler
    from trainer.callbacks.lambda_function import LambdaCallback
    from trainer.callbacks.lr_finder import LearningRateFinder
    from trainer.callbacks.lr_monitor import LearningRateMonitor
    from trainer.callbacks.model_checkpoint import ModelCheckpoint, OnExceptionCheckpoint
    from trainer.callbacks.model_summary import ModelSummary, RichModelSummary
    from trainer.callbacks.prediction_writer import BasePredictionWriter
    from trainer.callbacks.progress import RichProgressBar, RichProgressBarTheme
    from trainer.callbacks.progress_bar import ProgressBar
    from trainer.callbacks.pruning import ModelPruning
    from trainer.callbacks.spike import LossSpikeError, SpikeDetection
    from trainer.callbacks.step_averaging import EMAWeightAveraging, WeightAveraging
    from trainer.callbacks.throughput import ThroughputMonitor
    from trainer.callbacks.timer import Timer
    from trainer.callbacks.tqdm_progress import TQDMProgressBar
    from trainer.callbacks.tuner import Tuner
    from trainer.callbacks.weight_averaging import StochasticWeightAveraging

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "Checkpoint",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "FitSummary",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "LossSpikeError",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "RichProgressBarTheme",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "Tuner",
    "WeightAveraging",
]

_LAZY = {
    "ModelCheckpoint": "trainer.callbacks.model_checkpoint",
    "OnExceptionCheckpoint": "trainer.callbacks.model_checkpoint",
    "ModelSummary": "trainer.callbacks.model_summary",
    "ModelPruning": "trainer.callbacks.pruning",
    "RichModelSummary": "trainer.callbacks.model_summary",
    "RichProgressBar": "trainer.callbacks.progress",
    "RichProgressBarTheme": "trainer.callbacks.progress",
    "ProgressBar": "trainer.callbacks.progress_bar",
    "TQDMProgressBar": "trainer.callbacks.tqdm_progress",
    "BaseFinetuning": "trainer.callbacks.finetuning",
    "BackboneFinetuning": "trainer.callbacks.finetuning",
    "BasePredictionWriter": "trainer.callbacks.prediction_writer",
    "DeviceStatsMonitor": "trainer.callbacks.device_stats",
    "EarlyStopping": "trainer.callbacks.early_stopping",
    "FitSummary": "trainer.callbacks.fit_summary",
    "GradientAccumulationScheduler": "trainer.callbacks.gradient_accumulation",
    "LambdaCallback": "trainer.callbacks.lambda_function",
    "LearningRateMonitor": "trainer.callbacks.lr_monitor",
    "LossSpikeError": "trainer.callbacks.spike",
    "SpikeDetection": "trainer.callbacks.spike",
    "ThroughputMonitor": "trainer.callbacks.throughput",
    "Timer": "trainer.callbacks.timer",
    "BatchSizeFinder": "trainer.callbacks.batch_size_finder",
    "LearningRateFinder": "trainer.callbacks.lr_finder",
    "Tuner": "trainer.callbacks.tuner",
    "StochasticWeightAveraging": "trainer.callbacks.weight_averaging",
    "WeightAveraging": "trainer.callbacks.step_averaging",
    "EMAWeightAveraging": "trainer.callbacks.step_averaging",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.callbacks' has no attribute {name!r}")
