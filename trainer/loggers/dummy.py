"""DummyLogger: what stands in for the loggers under ``fast_dev_run`` (Lightning's).

It accepts every call and writes nothing, so a module or callback that logs through
``self.logger`` (``self.logger.experiment.add_image(...)``, a LearningRateMonitor) runs as it
will in the real run, without a file or a run created by the smoke test.
"""

from __future__ import annotations

from typing import Any

from trainer.loggers.logger import Logger

__all__ = ["DummyExperiment", "DummyLogger"]


class DummyExperiment:
    """An experiment whose every attribute is a function that does nothing (returns None)."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Accept anything; do nothing."""

    def __getattr__(self, name: str) -> Any:
        return self.nop

    def __getitem__(self, index: Any) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any) -> None:
        pass


class DummyLogger(Logger):
    """A logger that records nothing: ``Trainer(fast_dev_run=...)`` puts one in place of the
    configured loggers (none when the Trainer has no logger), as Lightning does.

    Examples:
        >>> logger = DummyLogger()
        >>> logger.experiment.add_scalar("loss", 0.5, 3)  # does nothing
        >>> logger.log_metrics({"loss": 0.5}, step=3)  # neither
    """

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def experiment(self) -> DummyExperiment:
        return self._experiment

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        pass

    def __getitem__(self, index: int) -> DummyLogger:
        return self
