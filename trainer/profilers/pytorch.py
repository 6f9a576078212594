"""`PyTorchProfiler`: operator-level profiling with ``torch.profiler``, exported as Chrome traces.

This module owns one ``torch.profiler.profile`` per stage: it is entered on the stage's first
action, each action is marked with ``record_function`` so it shows in the trace, the profiler
is stepped when a step action stops (``training_step`` while fitting, the stage's own step when
only evaluating or predicting), and each finished recording cycle is written as
``<dirpath>/<stage>[-<filename>][-<local_rank>]-<step action>.pt.trace.json``. ``torch.profiler``
is imported when a `PyTorchProfiler` is built, not when ``trainer.profilers`` is imported. It does
not choose the actions nor where the text report goes (the `Profiler` base class does).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from trainer._warnings import warn_user
from trainer.errors import ConfigurationError, describe
from trainer.profilers.profiler import Profiler

__all__ = ["PyTorchProfiler"]

# The action whose end is one profiler step, per stage (fit steps on training steps only).
_STEP_ACTIONS: dict[str | None, frozenset[str]] = {
    "fit": frozenset({"training_step"}),
    "validate": frozenset({"validation_step"}),
    "test": frozenset({"test_step"}),
    "predict": frozenset({"predict_step"}),
}
_ANY_STEP = frozenset().union(*_STEP_ACTIONS.values())
_SORT_KEYS = frozenset(
    f"{prefix}{device}_{what}"
    for prefix in ("", "self_")
    for device in ("cpu", "cuda", "device")
    for what in ("time_total", "memory_usage")
) | {"cpu_time", "cuda_time", "device_time", "count"}
# Lightning's default: skip 1 step, warm up 1, record 3, once; needs 5 steps to complete.
_DEFAULT_WAIT, _DEFAULT_WARMUP, _DEFAULT_ACTIVE = 1, 1, 3
_RECORD_PREFIX = "[trainer]"


class PyTorchProfiler(Profiler):
    """Profile operators (CPU, and CUDA when available) with ``torch.profiler``.

    Each action shows in the trace as ``[trainer]<action name>``. The profiler steps when
    ``training_step`` stops (``validation_step`` / ``test_step`` / ``predict_step`` when only
    that stage runs). With no ``schedule``, Lightning's default applies: wait 1 step, warm up 1,
    record 3, once; a run of fewer steps can say so with ``expect_steps`` to record every step.
    Each recorded cycle is exported as a Chrome trace (open it at https://ui.perfetto.dev or in
    ``chrome://tracing``) into ``dirpath``, or the Trainer's log directory. ``summary()`` is
    ``torch.profiler``'s table of operators, sorted by total CPU time (CUDA time on a GPU).

    Args:
        dirpath: folder of the traces and of the report file; ``None`` uses the Trainer's log
            directory.
        filename: names the files (``fit-<filename>-training_step.pt.trace.json``), and when
            given the report is appended to ``<dirpath>/<stage>-<filename>.txt`` instead of
            being printed.
        export_to_chrome: write a Chrome trace per recorded cycle (and per rank).
        schedule: a ``torch.profiler.schedule(...)``, passed through; ``None`` uses Lightning's
            default described above.
        row_limit: rows of the summary table; ``-1`` shows all (Lightning's name).
        sort_by_key: column the summary is sorted by, e.g. ``"self_cpu_time_total"``
            (Lightning's name); ``None`` picks ``cpu_time_total``, or ``cuda_time_total`` with
            CUDA.
        **torch_profiler_kwargs: any other argument of ``torch.profiler.profile``
            (``record_shapes``, ``profile_memory``, ``with_stack``, ``activities``, ...). Passing
            ``on_trace_ready`` replaces the Chrome export.

    Raises:
        ConfigurationError: an argument ``torch.profiler.profile`` does not take, a ``schedule``
            that is not a schedule, an unknown ``sort_by_key``; from ``start``, when
            ``torch.profiler`` refuses to start (another profiler runs, on torch versions that
            allow only one).

    Example:
        >>> import json, pathlib, tempfile, torch
        >>> folder = tempfile.mkdtemp()
        >>> profiler = PyTorchProfiler(dirpath=folder)
        >>> profiler.setup("fit")
        >>> for _ in range(5):
        ...     with profiler.profile("training_step"):
        ...         loss = (torch.randn(64, 64) @ torch.randn(64, 64)).sum()
        >>> report = profiler.summary()
        >>> trace = pathlib.Path(folder, "fit-training_step.pt.trace.json")
        >>> "traceEvents" in json.loads(trace.read_text())
        True
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        export_to_chrome: bool = True,
        schedule: Callable[[int], Any] | None = None,
        *,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        **torch_profiler_kwargs: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        import torch
        import torch.profiler

        _check_torch_profiler_kwargs(torch_profiler_kwargs)
        self._default_schedule: Callable[[int], Any] | None = None
        if schedule is None:
            schedule = self._default_schedule = torch.profiler.schedule(
                wait=_DEFAULT_WAIT, warmup=_DEFAULT_WARMUP, active=_DEFAULT_ACTIVE, repeat=1
            )
        _check_schedule(schedule)
        activities = torch_profiler_kwargs.pop("activities", None)
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        uses_cuda = torch.profiler.ProfilerActivity.CUDA in activities
        sort_by_key = sort_by_key or ("cuda_time_total" if uses_cuda else "cpu_time_total")
        if sort_by_key not in _SORT_KEYS:
            raise ConfigurationError(
                f"PyTorchProfiler(sort_by_key={sort_by_key!r}): unknown column; expected one of "
                f"{', '.join(sorted(_SORT_KEYS))}. Pass e.g. sort_by_key='self_cpu_time_total'."
            )
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key
        self._schedule = schedule
        self._has_own_trace_handler = "on_trace_ready" in torch_profiler_kwargs
        self._record_function = torch.profiler.record_function
        self._torch_kwargs = {"activities": activities, **torch_profiler_kwargs}
        self._profiler: Any = None  # the running torch.profiler.profile, between start and summary
        self._events: Any = None  # the last recorded cycle's events, kept for summary()
        self._records: dict[str, Any] = {}  # action -> its open record_function
        self._step_actions = _ANY_STEP
        self._last_step_action: str | None = None
        self._steps = 0  # step actions seen by the running torch profiler
        self._cycles = 0  # cycles recorded since setup (numbers the trace files)
        self._has_warned_no_dirpath = False

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank=local_rank, log_dir=log_dir)
        self._step_actions = _STEP_ACTIONS.get(stage, _ANY_STEP)
        self._last_step_action = None
        self._cycles = 0

    def expect_steps(self, num_steps: int | float) -> None:
        """Say how many steps the stage will run; below 5, the default schedule records them all.

        Lightning replaces its default schedule the same way for runs too short to complete
        it (``fast_dev_run``, ``limit_train_batches=2``). A schedule you passed is never changed.

        Args:
            num_steps: the number of step actions expected (``float("inf")`` when unknown).
        """
        if self._default_schedule is None:
            return
        too_short = num_steps < _DEFAULT_WAIT + _DEFAULT_WARMUP + _DEFAULT_ACTIVE
        self._schedule = _record_every_step if too_short else self._default_schedule
        if self._profiler is not None:
            self._profiler.schedule = self._schedule

    def start(self, action_name: str) -> None:
        if self._profiler is None:
            self._start_torch_profiler()
        if action_name not in self._records:
            record = self._record_function(_RECORD_PREFIX + action_name)
            record.__enter__()
            self._records[action_name] = record

    def stop(self, action_name: str) -> None:
        record = self._records.pop(action_name, None)
        if record is not None:
            record.__exit__(None, None, None)
        if action_name in self._step_actions and self._profiler is not None:
            self._last_step_action = action_name
            self._steps += 1
            self._profiler.step()

    def summary(self) -> str:
        """``torch.profiler``'s operator table of the last recorded cycle; empty if none was."""
        self._stop_torch_profiler()
        if self._events is None or len(self._events) == 0:
            return ""
        averages = self._events.key_averages()
        table = averages.table(sort_by=self.sort_by_key, row_limit=self.row_limit)
        return self._stats_to_str({"records": table})

    def teardown(self, stage: str | None) -> None:
        """Close open actions and the torch profiler (exporting a cycle still being recorded)."""
        self._stop_torch_profiler()
        super().teardown(stage)

    def _start_torch_profiler(self) -> None:
        """Enter a fresh ``torch.profiler.profile``; wraps torch's error if it cannot start."""
        import torch.profiler

        kwargs = dict(self._torch_kwargs, schedule=self._schedule)
        if not self._has_own_trace_handler:
            kwargs["on_trace_ready"] = self._export_trace
        profiler = torch.profiler.profile(**kwargs)
        try:
            profiler.__enter__()
        except RuntimeError as err:
            raise ConfigurationError(
                f"PyTorchProfiler could not start torch.profiler ({err}). Another torch profiler "
                "or autograd profiler is running in this process: exit it first, or use one "
                "PyTorchProfiler per process (one per Trainer run)."
            ) from err
        self._profiler = profiler
        self._events = None
        self._steps = 0

    def _stop_torch_profiler(self) -> None:
        """Close open ``record_function`` ranges, exit the profiler and keep its events."""
        for record in reversed(list(self._records.values())):
            record.__exit__(None, None, None)
        self._records.clear()
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        if profiler.profiler is not None:  # None when no step was ever recorded
            self._events = profiler.events()
        if self._steps and not self._cycles and not self._has_own_trace_handler:
            warn_user(
                f"PyTorchProfiler recorded nothing: {self._steps} step(s) ran, too few for the "
                "schedule (the default waits 1 step, warms up 1, then records 3). For a short "
                f"run call profiler.expect_steps({self._steps}) before it, or pass a schedule "
                "that fits the run."
            )

    def _export_trace(self, profiler: Any) -> None:
        """``on_trace_ready``: write the finished cycle as a Chrome trace into the folder."""
        self._cycles += 1
        if not self.export_to_chrome:
            return
        if not self.dirpath:
            if not self._has_warned_no_dirpath:
                self._has_warned_no_dirpath = True
                warn_user(
                    "PyTorchProfiler did not export its Chrome trace: dirpath is None and no "
                    "log_dir was given to setup(). Pass PyTorchProfiler(dirpath='profiles'), or "
                    "export_to_chrome=False to silence this."
                )
            return
        action = self._last_step_action or "trace"
        if self._cycles > 1:
            action = f"{action}-{self._cycles}"
        os.makedirs(self.dirpath, exist_ok=True)
        name = self._file_name(action_name=action, extension=".pt.trace.json")
        profiler.export_chrome_trace(os.path.join(os.fspath(self.dirpath), name))


def _record_every_step(step: int) -> Any:
    """The schedule of a short run: record every step (torch's own default when none is given)."""
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def _check_torch_profiler_kwargs(kwargs: dict[str, Any]) -> None:
    """Reject at construction what ``torch.profiler.profile`` would reject at the first action."""
    import torch.profiler

    accepted = set(inspect.signature(torch.profiler.profile.__init__).parameters) - {"self"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigurationError(
            f"PyTorchProfiler received {', '.join(unknown)}, which torch.profiler.profile does not "
            f"take; it takes {', '.join(sorted(accepted - {'schedule'}))} (schedule is "
            "PyTorchProfiler's own argument). Remove or rename the argument."
        )


def _check_schedule(schedule: object) -> None:
    """A schedule is a callable from step number to ``ProfilerAction``, like torch's ``schedule()``."""
    from torch.profiler import ProfilerAction

    action = schedule(0) if callable(schedule) else None
    if not isinstance(action, ProfilerAction):
        raise ConfigurationError(
            f"PyTorchProfiler(schedule=...) received {describe(schedule)}; expected a callable "
            "that maps a step number to a torch.profiler.ProfilerAction. Pass e.g. "
            "torch.profiler.schedule(wait=1, warmup=1, active=3), or None for that default."
        )
