"""Put a Trainer's stages under its profiler, at no cost when none is chosen.

This module owns which parts of the loop are timed and under which action names (listed in
docs/profilers.md). It does not time anything itself (``trainer.profilers`` does) and it does not
decide the loop's order (``trainer/trainer/trainer.py`` does). Profiling works by replacing, for one
run, the Trainer's stage methods with timed wrappers stored on the instance; with the default
`PassThroughProfiler` nothing is wrapped, so the per-step path is unchanged.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from trainer._warnings import warn_user
from trainer.profilers import PassThroughProfiler, Profiler

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = [
    "BOTTLENECK_BATCHES",
    "BOTTLENECK_SHARE",
    "STAGE_ACTIONS",
    "TRAINER_ACTIONS",
    "expect_steps",
    "is_profiling",
    "profile_fit_loop",
    "profiled",
    "profiled_batches",
    "profiled_steps",
    "start",
    "stop",
    "warn_if_loading_dominates",
]

# FitLoop method -> action name. Each is replaced by a timed wrapper on the loop of a profiled fit.
STAGE_ACTIONS: dict[str, str] = {
    "_train_epoch": "run_training_epoch",
    "_train_batch": "run_training_batch",
    "backward": "backward",
    "_optimizer_step": "optimizer_step",
    "_zero_grad": "zero_grad",
    "_run_validation": "run_validation",
}
# Trainer method -> action name, timed while any profiled stage runs.
TRAINER_ACTIONS: dict[str, str] = {"save_checkpoint": "save_checkpoint"}


def is_profiling(profiler: Profiler) -> bool:
    """Whether ``profiler`` records anything (the pass-through one does not)."""
    return not isinstance(profiler, PassThroughProfiler)


def profiled(profiler: Profiler, action: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` timed as ``action`` on every call."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with profiler.profile(action):
            return function(*args, **kwargs)

    return timed


def profiled_steps(profiler: Profiler, run_step: Callable[..., Any]) -> Callable[..., Any]:
    """``run_step(step_name, *args)`` timed under the step's own name (``validation_step``...)."""

    def timed(step_name: str, *args: Any) -> Any:
        with profiler.profile(step_name):
            return run_step(step_name, *args)

    return timed


def profiled_batches(
    profiler: Profiler, batches: Iterable[Any], *, loader: Any = None
) -> Iterator[Any]:
    """The items of ``batches``, each fetch timed as ``get_train_batch``.

    Fetching is also set against the whole batch (fetch + step): when, over the first
    `BOTTLENECK_BATCHES` batches of the epoch, fetching takes more than `BOTTLENECK_SHARE` of the
    time, warn once per loader, naming it and the share measured (Lightning only guesses this from
    ``num_workers``).
    """
    iterator = iter(batches)
    fetch_seconds = total_seconds = 0.0
    count = 0
    while True:
        started = time.perf_counter()
        with profiler.profile("get_train_batch"):
            try:
                batch = next(iterator)
            except StopIteration:
                return
        fetched = time.perf_counter()
        yield batch
        if count < BOTTLENECK_BATCHES:
            fetch_seconds += fetched - started
            total_seconds += time.perf_counter() - started
            count += 1
            if count == BOTTLENECK_BATCHES:
                warn_if_loading_dominates(loader, fetch_seconds, total_seconds)


BOTTLENECK_BATCHES = 10  # batches measured at the start of each epoch
BOTTLENECK_SHARE = 0.2  # fetching above this share of the step time is a bottleneck
_warned_loaders: weakref.WeakSet[Any] = weakref.WeakSet()  # loaders already warned about


def warn_if_loading_dominates(loader: Any, fetch_seconds: float, total_seconds: float) -> None:
    """Warn once per loader when fetching batches took more than `BOTTLENECK_SHARE` of the time."""
    if total_seconds <= 0 or fetch_seconds / total_seconds <= BOTTLENECK_SHARE:
        return
    if loader is not None:
        if loader in _warned_loaders:
            return
        _warned_loaders.add(loader)
    source = getattr(loader, "base_dataloader", loader)
    dataset = type(getattr(source, "dataset", None)).__name__
    workers = getattr(source, "num_workers", None)
    pinned = getattr(source, "pin_memory", None)
    warn_user(
        f"trainer: fetching batches from the train dataloader (dataset {dataset}, num_workers="
        f"{workers}, pin_memory={pinned}) took {fetch_seconds / total_seconds:.0%} of the time of "
        f"the first {BOTTLENECK_BATCHES} batches of the epoch, measured by the profiler: the "
        "data loading is the bottleneck. Raise num_workers (and set persistent_workers=True), "
        "set pin_memory=True when training on a GPU, or make the dataset's __getitem__ cheaper."
    )


def start(trainer: Trainer, stage: str) -> None:
    """Set the profiler up for ``stage`` and time the Trainer's stages (when profiling)."""
    profiler = trainer.profiler
    if not is_profiling(profiler):
        return
    local_rank = trainer.local_rank if trainer.world_size > 1 else None  # Lightning's file names
    profiler.setup(stage, local_rank=local_rank, log_dir=trainer.log_dir)
    _wrap_methods(profiler, trainer, TRAINER_ACTIONS)


def profile_fit_loop(profiler: Profiler, fit_loop: object) -> None:
    """Time the stages of one fit (`STAGE_ACTIONS`) on its loop object, when profiling."""
    if is_profiling(profiler):
        _wrap_methods(profiler, fit_loop, STAGE_ACTIONS)


def _wrap_methods(profiler: Profiler, owner: object, actions: dict[str, str]) -> None:
    for method, action in actions.items():
        bound = getattr(type(owner), method).__get__(owner)
        setattr(owner, method, profiled(profiler, action, bound))


def expect_steps(trainer: Trainer, stage: str) -> None:
    """Tell a profiler with a step schedule (PyTorchProfiler) how many steps the stage has."""
    expect = getattr(trainer.profiler, "expect_steps", None)
    if expect is None or not is_profiling(trainer.profiler):
        return
    counts = {
        "fit": "estimated_stepping_batches",
        "validate": "num_val_batches",
        "test": "num_test_batches",
        "predict": "num_predict_batches",
    }
    steps = getattr(trainer, counts.get(stage, ""), float("inf"))
    expect(steps if isinstance(steps, int | float) else float("inf"))


def stop(trainer: Trainer, stage: str) -> None:
    """Restore the Trainer's methods, print and write the summary, end the profiler's stage."""
    profiler = trainer.profiler
    if not is_profiling(profiler) or "save_checkpoint" not in trainer.__dict__:
        return  # no profiler, or the stage failed before `start`
    for method in TRAINER_ACTIONS:
        trainer.__dict__.pop(method, None)
    if trainer.state.status == "finished":
        profiler.describe()  # the report, then its own teardown
    profiler.teardown(stage)  # after a failure: switch cProfile / torch.profiler off
