"""The Accelerator's option dataclasses, with Accelerate's names and defaults.

Each dataclass checks its own values on construction and says which field to change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainer.errors import ConfigurationError, describe

__all__ = ["DataLoaderConfiguration", "GradientAccumulationPlugin", "ProjectConfiguration"]

_MAX_DATA_SEED = 2**32 - 1  # seed_everything's range: numpy's legacy generator takes 32 bits


@dataclass
class ProjectConfiguration:
    """Where an Accelerator keeps its files.

    Args:
        project_dir: the root for checkpoints and logs.
        logging_dir: where trackers write; defaults to ``project_dir``.
        automatic_checkpoint_naming: ``save_state()`` writes ``project_dir/checkpoints/checkpoint_N``.
        total_limit: keep at most this many automatic checkpoints (oldest pruned after a save).
        iteration: the next checkpoint number (advanced by ``save_state``).
    """

    project_dir: str | os.PathLike[str] | None = None
    logging_dir: str | os.PathLike[str] | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise ConfigurationError(
                f"ProjectConfiguration(total_limit={describe(self.total_limit)}): expected a "
                "positive int or None."
            )

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir`` and, if unset, ``logging_dir``."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` treats dataloaders (Accelerate's semantics).

    Args:
        split_batches: the loader's batch size is the global one and is split across processes.
        dispatch_batches: the main process reads the data and sends each process its slice.
        even_batches: complete the last batch with samples from the start so every process
            steps equally; ``gather_for_metrics`` drops the duplicates.
        use_seedable_sampler: shuffle with a sampler seeded identically on every process.
        data_seed: with ``use_seedable_sampler``, the seed of the shuffle (an int in
            [0, 2**32 - 1]); None draws one from torch's global generator when the loader is
            prepared, so ``torch.manual_seed`` before ``prepare`` decides it.
        non_blocking: copy batches to the device asynchronously (with pinned memory).
        use_stateful_dataloader: prepare loaders as torchdata's ``StatefulDataLoader``, whose
            position ``save_state`` / ``load_state`` carry, so a resume reads nothing again
            (needs ``pip install 'trainer[stateful]'``).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        seed = self.data_seed
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_DATA_SEED
        ):
            raise ConfigurationError(
                f"DataLoaderConfiguration(data_seed={describe(seed)}): expected None or an int in "
                f"[0, {_MAX_DATA_SEED}]. Pass a seed such as 42."
            )


@dataclass
class GradientAccumulationPlugin:
    """How ``accumulate`` counts.

    Args:
        num_steps: batches per optimizer step.
        adjust_scheduler: accepted, with no effect: in Accelerate 1.15 the value never reaches
            the scheduler either, which steps once per optimizer step.
        sync_with_dataloader: force a sync (and a step) at the end of the dataloader.
        sync_each_batch: synchronise gradients on every batch (saves memory, costs speed).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if (
            not isinstance(self.num_steps, int)
            or isinstance(self.num_steps, bool)
            or self.num_steps < 1
        ):
            raise ConfigurationError(
                f"GradientAccumulationPlugin(num_steps={describe(self.num_steps)}): expected an "
                "int >= 1."
            )
