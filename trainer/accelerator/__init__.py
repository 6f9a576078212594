"""The Accelerator layer: the one path every model, optimizer, dataloader, loss and tensor takes.

- ``accelerator``: ``Accelerator`` (prepare / backward / accumulate / gather / save_state ...).
- ``optimizer``: ``AcceleratedOptimizer`` / ``AcceleratedScheduler``, the prepared wrappers.
- ``collectives``: gather / reduce / broadcast over the strategy's process group.
- ``memory``: ``find_executable_batch_size`` and freeing device memory.
- ``launchers`` / ``launch_config``: ``notebook_launcher``, ``debug_launcher`` and the
  ``trainer launch`` configuration file.

May import: ``trainer.runtime``, ``trainer.strategies``, ``trainer.precision``, ``trainer.data``,
``trainer.checkpoint``, ``trainer.big_modeling``, ``trainer.loggers`` (registry only),
``trainer.plugins`` and the base modules. Never the Trainer layer, callbacks or the CLI.
"""

from __future__ import annotations

from trainer.accelerator.accelerator import Accelerator

__all__ = ["Accelerator"]
