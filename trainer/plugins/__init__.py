"""Plugins for ``Trainer(plugins=[...])`` (Lightning's names, DESIGN §9).

`AsyncCheckpointIO` writes checkpoints on a background thread. Precision plugins
(``trainer.precision``) and cluster environments (``trainer.strategies.environment``) are also
accepted in ``plugins``; they live in their own packages.
"""

from trainer.plugins.async_checkpoint import AsyncCheckpointIO, PendingSave

__all__ = ["AsyncCheckpointIO", "PendingSave"]
