"""`SaveConfigCallback`: a config-driven run's resolved config, next to its logs and in its checkpoints.

``TrainerCLI`` adds it to the Trainer's callbacks, so ``trainer fit --config
<log_dir>/config.yaml`` runs the same job again. Subclass it and override `save_config` to
send the config elsewhere too (a logger's hyperparameters, say).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.callbacks.callback import Callback
from trainer.errors import ConfigurationError
from trainer.trainer.module import TrainModule
from trainer.trainer.trainer import Trainer

__all__ = ["CLI_CONFIG_KEY", "CONFIG_FILENAME", "SaveConfigCallback"]

CLI_CONFIG_KEY = "cli_config"  # the checkpoint key holding the resolved config
CONFIG_FILENAME = "config.yaml"


class SaveConfigCallback(Callback):
    """Write the resolved config to ``<log_dir>/config.yaml`` and into every checkpoint.

    On global rank 0, at ``setup`` of every stage, the YAML text goes to
    ``<trainer.log_dir>/<config_filename>`` (an existing file there is replaced: with the
    default logger each run has its own ``version_<N>`` folder). Every checkpoint gets the config
    as a mapping under the key ``cli_config``.

    Args:
        config: the resolved config, as a mapping of plain values (what ``yaml.safe_load`` of
            ``config_text`` gives).
        config_text: the same config as YAML text.
        config_filename: the file name inside the log directory.
        overwrite: replace a file of that name already there (True); False refuses to start
            the run over it (LightningCLI's default), with a `ConfigurationError`.

    Examples:
        >>> callback = SaveConfigCallback({"trainer": {"max_epochs": 1}}, "trainer:\\n  max_epochs: 1\\n")
        >>> Trainer(callbacks=[callback]).fit(module)  # doctest: +SKIP
        >>> # trainer_logs/version_0/config.yaml now holds the config
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        config_text: str,
        *,
        config_filename: str = CONFIG_FILENAME,
        overwrite: bool = True,
    ) -> None:
        self.config = copy.deepcopy(dict(config))
        self.config_text = config_text
        self.config_filename = config_filename
        self.overwrite = overwrite

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """Write the config file next to the logs, then `save_config` (global rank 0 only)."""
        if not trainer.is_global_zero:
            return
        from trainer.checkpoint.atomic import atomic_write_text

        directory = Path(trainer.log_dir)
        path = directory / self.config_filename
        if not self.overwrite and path.exists():
            raise ConfigurationError(
                f"SaveConfigCallback: {path} already exists and overwrite is False, so this "
                "run would replace the config of an earlier one. Give this run its own log "
                "directory, or pass save_config_kwargs={'overwrite': True}."
            )
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, self.config_text)
        self.save_config(trainer, module, stage)

    def save_config(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """Override to record the config elsewhere as well (``self.config``, a mapping, or
        ``self.config_text``, YAML); runs on global rank 0 after the file is written."""

    def on_save_checkpoint(
        self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]
    ) -> None:
        """Put the config in the checkpoint under ``cli_config``."""
        checkpoint[CLI_CONFIG_KEY] = copy.deepcopy(self.config)
