"""The Trainer layer: the managed loop and the classes a user subclasses for it.

- ``trainer``: ``Trainer`` (fit / validate / test / predict), its state and progress.
- ``module`` / ``module_hooks``: ``TrainModule`` and ``DataModule``, and the hooks they receive.
- ``hooks``: which hooks exist, in which order they run, and who receives each.
- ``fit_loop`` / ``batch_step`` / ``evaluation_loop`` / ``validation_schedule``: the loops, one
  training batch (also the finders' trial steps) and when to validate;
  ``loss``, ``closure``, ``manual_step``: a training step's result, closure optimizers (LBFGS),
  manual optimization's ``step()``.
- ``loaders`` / ``dataloader_idx``: each stage's dataloaders; several eval loaders.
- ``hook_table``, ``prepare``, ``properties``, ``run``, ``logger_rows``: see docs/layout.md.
- ``metrics`` / ``metric_entry``: the store behind ``self.log`` (step / epoch values, sync).
- ``optimizer_config``: turning ``configure_optimizers``' return value into optimizers and schedulers.
- ``options``: resolving the Trainer's constructor arguments (callbacks, loggers, plugins ...).
- ``checkpoint_state``: what the Trainer puts in a checkpoint and how it takes it back.
- ``preemption``: saving on SIGTERM / SIGUSR1 before a cluster stops the job.
- ``profiling``: wiring a profiler around the Trainer's own methods for one run.

May import: ``trainer.accelerator`` and everything below it, ``trainer.callbacks`` and
``trainer.loggers`` (the defaults it installs), ``trainer.profilers``, ``trainer.plugins``.
Callbacks and loggers see the Trainer through its public attributes only.
"""

from __future__ import annotations

from trainer.trainer.module import DataModule, TrainModule
from trainer.trainer.trainer import Progress, Trainer, TrainerState

__all__ = ["DataModule", "Progress", "TrainModule", "Trainer", "TrainerState"]
