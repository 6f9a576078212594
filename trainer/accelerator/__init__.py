"""The Accelerator layer: the one path every model, optimizer, dataloader, loss and tensor takes.

- ``accelerator``: ``Accelerator`` (construction, prepare, backward / accumulate, trackers), with
  its process verbs in ``process_api`` (the ``on_*_process`` decorators from ``decorators``,
  ``trigger_sync_in_backward`` from ``triggers``) and its checkpoint verbs in ``checkpoint_api``.
- ``engine_setup`` / ``engine_configs`` / ``handler_setup``: Accelerate's plugins and kwargs
  handlers (the dataclasses live in ``trainer.runtime``) translated onto the strategies and
  precision plugins.
- ``parallelism``: ``ParallelismConfig`` and the strategy its mesh needs.
- ``pipelining`` (``prepare_pippy``), ``local_sgd`` (``LocalSGD``).
- ``optimizer``: ``AcceleratedOptimizer`` / ``AcceleratedScheduler``, the prepared wrappers.
- ``collectives``: gather / reduce / broadcast over the strategy's process group;
  ``operations``: the same as Accelerate's free functions, over the current process group;
  ``data_loader``: the free ``prepare_data_loader``.
- ``memory``: ``find_executable_batch_size`` and freeing device memory.
- ``model_wrappers``: the autocast forward of mixed-precision models.
- ``launchers`` / ``launch_config`` / ``machine_watch``: ``notebook_launcher``,
  ``debug_launcher``, the ``trainer launch`` configuration file, and watching the other machines.

May import: ``trainer.runtime``, ``trainer.strategies``, ``trainer.precision``, ``trainer.data``,
``trainer.checkpoint``, ``trainer.big_modeling``, ``trainer.loggers`` (registry only),
``trainer.plugins`` and the base modules. Never the Trainer layer, callbacks or the CLI.
"""

from __future__ import annotations

from trainer.accelerator.accelerator import Accelerator

__all__ = ["Accelerator"]
