"""The Accelerator's tracker verbs: ``init_trackers``, ``log``, ``get_tracker``.

`TrackerAPI` is a base of `trainer.accelerator.Accelerator`. The trackers themselves are the
loggers of ``trainer.loggers`` (built by ``trainer.loggers.registry``); ``end_training``, which
finishes them and ends the process group, stays on the Accelerator.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.errors import ConfigurationError

__all__ = ["TrackerAPI"]


class TrackerAPI:
    """Starting experiment trackers on the main process and sending them values."""

    # set by the Accelerator's constructor
    log_with: Any
    trackers: list[Any]
    is_main_process: bool
    logging_dir: str | os.PathLike[str] | None

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start the trackers named in ``log_with`` for ``project_name`` (main process only)."""
        from trainer.loggers.registry import build_trackers

        if not self.is_main_process:
            return
        self.trackers = build_trackers(
            self.log_with,
            project_name=project_name,
            logging_dir=self.logging_dir,
            init_kwargs=init_kwargs or {},
        )
        if config is not None:
            for tracker in self.trackers:
                tracker.log_hyperparams(dict(config))

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Send ``values`` to every tracker (main process only); tensors are read here.

        ``log_kwargs``, as Accelerate's: ``{tracker_name: {keyword: value}}``, each passed to
        that tracker's ``log`` (e.g. ``{"wandb": {"commit": False}}``, ``{"tensorboard":
        {"walltime": t}}``); the MLflow and CSV trackers take none, as Accelerate's MLflow one.
        """
        if not self.is_main_process or not self.trackers:
            return
        per_tracker = log_kwargs or {}
        for tracker in self.trackers:  # step None: one past the tracker's last step
            tracker.log(values, step, **per_tracker.get(getattr(tracker, "tracker_name", ""), {}))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker whose ``name`` (e.g. "csv") matches; its backend object if ``unwrap``.

        Where no tracker runs (processes other than the main one, or before ``init_trackers``)
        a `BlankTracker` whose calls do nothing, as Accelerate.

        Raises:
            ConfigurationError: trackers run, but none is ``name``.
        """
        if not self.trackers:
            from trainer.loggers.logger import BlankTracker

            return BlankTracker()
        for tracker in self.trackers:
            if getattr(tracker, "tracker_name", None) == name or type(
                tracker
            ).__name__.lower().startswith(name.lower()):
                return tracker.experiment if unwrap else tracker
        raise ConfigurationError(
            f"get_tracker({name!r}): no such tracker was started; started: "
            f"{[type(t).__name__ for t in self.trackers]}. Pass it in Accelerator(log_with=...) "
            "and call init_trackers first."
        )
