"""The runtime layer: what this process is and the settings every layer above reads.

- ``state``: ``PartialState`` (rank, world size, device, distributed type) and the enums.
- ``gradient_state``: whether this micro-batch ends an accumulation window or the dataloader.
- ``launcher_watch``: a process started by torchrun's agent stops itself (SIGTERM) when the
  agent is gone.
- ``seed``: ``seed_everything`` and the RNG states a checkpoint carries.
- ``configs``: the Accelerator's configuration dataclasses (``ProjectConfiguration``, ...).
- ``engine_plugins`` / ``kwargs_handlers``: Accelerate's plugin and kwargs-handler dataclasses
  (``FullyShardedDataParallelPlugin``, ``DistributedDataParallelKwargs`` ...), data only.

May import: ``trainer.errors`` and the other base modules (``trainer._imports``,
``trainer._warnings``) only. Strategies, precision plugins, data, the Accelerator and the
Trainer import this package, never the other way round.
"""
