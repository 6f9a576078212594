"""How a fit ends when the scheduler stops it, or when this process fails among several.

SIGTERM / SIGUSR1 during fit: every process finishes the optimizer step, they save one checkpoint
together (replacing earlier preemption checkpoints), and each exits with status 0. With
``AsyncCheckpointIO`` the save in flight completes first, then this one, before the exit. Under a SLURM batch job, SIGUSR1 (``#SBATCH
--signal=USR1@90``) also requeues the job (``scontrol requeue``) once the checkpoint is written,
as Lightning does; ``SLURMEnvironment(auto_requeue=False)`` turns that off.

The handler only records the signal; the fit loop acts on it at the next optimizer-step boundary,
so the saved state is consistent. The handlers stay for the whole call: a signal after training's
last step (in ``on_train_end`` / ``on_fit_end``) still saves and exits 0, and one during
validate / test / predict lets the call finish (results printed and logged), then exits 0
(`act_on_late_signal`). ``trainer launch`` forwards the signals it receives to the
processes it started (`trainer.accelerator.launchers`).

A process whose fit raises while others run bounds how long its collectives wait
(`trainer.strategies.ddp.bound_collective_timeout`): its ``on_exception`` hooks cannot keep the
job alive waiting for ranks that never join, and it names itself on stderr.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.checkpoint.atomic import discard_checkpoint, has_trainer_manifest
from trainer.errors import summarize_error
from trainer.strategies.environment import SLURMEnvironment, slurm_job_id
from trainer.trainer.checkpoint_state import checkpoint_dir

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = [
    "PREEMPTION_SIGNALS",
    "PreemptionSignal",
    "act_on_late_signal",
    "catch_preemption_signals",
    "is_preempted",
    "remove_superseded_preemption_checkpoints",
    "requeue_slurm_job",
    "save_and_exit",
]

PREEMPTION_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None
)
CHECK_EVERY = 10  # optimizer steps between the processes' agreement on a signal


class PreemptionSignal:
    """The SIGTERM / SIGUSR1 received during one fit, if any (``signum`` None: none yet)."""

    def __init__(self) -> None:
        self.signum: int | None = None


@contextlib.contextmanager
def catch_preemption_signals(stage: str = "fit") -> Iterator[PreemptionSignal]:
    """Record SIGTERM/SIGUSR1 in the yielded `PreemptionSignal` inside the block.

    Signal handlers can only be set in the main thread; elsewhere nothing is recorded. An
    exception leaving the block on one of several processes bounds its collectives (see the
    module docstring; ``stage``, the call, is named in its message); the exit of a preemption
    (status 0) does not.
    """
    received = PreemptionSignal()
    previous = {}
    if _is_multi_process():  # imported now: an import after a Ctrl-C is a window for a
        # DataLoader's SIGCHLD handler to replace the KeyboardInterrupt with its RuntimeError
        from torch.distributed.elastic.multiprocessing.errors import error_handler  # noqa: F401
    if threading.current_thread() is threading.main_thread():

        def record(signum: int, frame: object) -> None:
            received.signum = signum

        previous = {sig: signal.signal(sig, record) for sig in PREEMPTION_SIGNALS}
    try:
        yield received
    except BaseException as err:
        if not (isinstance(err, SystemExit) and not err.code):
            try:
                _bound_after_failure(err, stage)
            except Exception:  # never replace the error that ended the fit
                pass
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _is_multi_process() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _bound_after_failure(err: BaseException, stage: str) -> None:
    """Bound this process's collectives and say which rank failed (several processes only).

    Under torchrun the failure is also written to the worker's error file, stamped now: the
    launcher's report then names this rank as the root cause, not a rank that failed later
    because this one stopped answering.
    """
    import torch.distributed as dist

    from trainer.strategies.ddp import FAILURE_TIMEOUT, bound_collective_timeout

    if not _is_multi_process():
        return
    bound_collective_timeout(FAILURE_TIMEOUT)
    what = summarize_error(err, limit=300).rstrip(".")  # the sentence adds its own period
    ended = "was interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
    print(
        f"trainer: rank {dist.get_rank()} of {dist.get_world_size()} {ended} during {stage}: "
        f"{what}. Its collectives now time out after "
        f"{FAILURE_TIMEOUT.total_seconds():.0f} s, so on_exception hooks cannot keep the job "
        "waiting for ranks that never join.",
        file=sys.stderr,
        flush=True,
    )
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and not os.path.exists(error_file):  # the first failure of this process only
        from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

        try:
            ErrorHandler().record_exception(err)
        except OSError as problem:  # the error that ended the fit is what is raised
            print(f"trainer: could not write {error_file}: {problem}", file=sys.stderr)


def is_preempted(trainer: Trainer, received: PreemptionSignal, *, is_end: bool = False) -> bool:
    """Whether any process got SIGTERM/SIGUSR1 (all must agree to save together).

    Answered only where an optimizer step just completed, so an accumulation window is never
    split; with several processes, every `CHECK_EVERY` steps (a collective every step would
    cost), at the same steps on every process. Once they agree, every process records the same
    signal: SIGTERM if any process saw it, else SIGUSR1. ``is_end``: asked once more after the
    last epoch, so a signal that came after the last agreement is not dropped.
    """
    if not is_end and not trainer.accelerator.sync_gradients:
        return False
    seen = received.signum is not None
    if trainer.world_size == 1:
        return seen
    if not is_end and trainer.global_step % CHECK_EVERY != 0:
        return False
    agreed = trainer.strategy.reduce_boolean_decision(seen, all=False)
    if agreed:
        flags = torch.tensor(
            [float(received.signum == sig) for sig in PREEMPTION_SIGNALS],
            device=trainer.strategy.root_device,
        )
        flags = trainer.strategy.all_reduce(flags, "max")
        received.signum = int(next(s for s, f in zip(PREEMPTION_SIGNALS, flags.tolist()) if f))
    return agreed


def act_on_late_signal(trainer: Trainer, received: PreemptionSignal, stage: str) -> None:
    """At the end of a call's work, act on a SIGTERM / SIGUSR1 no earlier check acted on.

    fit (after ``on_fit_end``): save where it stands and exit 0, as `save_and_exit`. validate /
    test / predict (after the epoch and its results): nothing to save; exit 0. With several
    processes every one takes part (one collective per call), so all exit together.
    """
    if not is_preempted(trainer, received, is_end=True):
        return
    if stage == "fit":
        save_and_exit(trainer, received)
    if trainer.is_global_zero:
        print(
            f"trainer: received {signal.Signals(received.signum).name} during {stage}; the "
            f"{stage} epoch is complete and its results are logged; exiting with status 0.",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(0)


def requeue_slurm_job(trainer: Trainer, signum: int) -> str | None:
    """On rank 0 of a SLURM batch job: ``scontrol requeue JOB`` after a preemption checkpoint.

    Only for the environment's requeue signal (SIGUSR1) and unless
    ``SLURMEnvironment(auto_requeue=False)`` was passed. A failing ``scontrol`` is reported on
    stderr, not raised: the checkpoint is written and the job can be resubmitted by hand.

    Returns:
        The requeued job id, or None when nothing was requeued.
    """
    environment = getattr(trainer.strategy, "environment", None)
    if isinstance(environment, SLURMEnvironment):
        is_on, requeue_signal = environment.auto_requeue, environment.requeue_signal
    else:
        is_on, requeue_signal = True, int(getattr(signal, "SIGUSR1", -1))
    job = slurm_job_id()
    if not (trainer.is_global_zero and is_on and signum == requeue_signal and job):
        return None
    try:
        result = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        problem = f"could not run scontrol ({err})"
    else:
        if result.returncode == 0:
            return job
        problem = f"scontrol requeue {job} exited with {result.returncode}: {result.stderr.strip()}"
    print(
        f"trainer: {problem}; the job was not requeued. Resubmit it: fit(ckpt_path='last') "
        "resumes from the checkpoint just written.",
        file=sys.stderr,
        flush=True,
    )
    return None


_PREEMPTED_NAME = re.compile(r"preempted-epoch=\d+-step=(\d+)")  # what save_and_exit names


def remove_superseded_preemption_checkpoints(path: Path, step: int) -> list[str]:
    """Delete the ``preempted-epoch=E-step=S`` checkpoints beside ``path`` with a lower step:
    the one just written supersedes them (without this, each preemption of a long job left a
    full checkpoint behind). Other folders, and one a user added files to, are kept; a failure
    to delete is reported on stderr, never raised (the exit must not fail). Returns the names."""
    removed = []
    for entry in sorted(path.parent.glob("preempted-epoch=*-step=*")):
        found = _PREEMPTED_NAME.fullmatch(entry.name)
        if found is None or int(found.group(1)) >= step or not has_trainer_manifest(entry):
            continue
        try:
            if discard_checkpoint(entry, "preemption"):
                removed.append(entry.name)
        except OSError as err:
            print(f"trainer: could not delete {entry}: {err}", file=sys.stderr, flush=True)
    return removed


def save_and_exit(trainer: Trainer, received: PreemptionSignal) -> None:
    """Save where training stands, requeue under SLURM, say so on stderr, exit with status 0."""
    name = signal.Signals(received.signum).name
    path = (
        checkpoint_dir(trainer)
        / f"preempted-epoch={trainer.current_epoch}-step={trainer.global_step}"
    )
    pending = trainer.save_checkpoint(path)
    if pending is not None:  # a background save (AsyncCheckpointIO): exit only once it is complete
        pending.wait()
    if trainer.is_global_zero:
        remove_superseded_preemption_checkpoints(path, trainer.global_step)
    job = requeue_slurm_job(trainer, received.signum)
    if trainer.is_global_zero:
        requeued = f"; requeued SLURM job {job}" if job else ""
        print(
            f"trainer: received {name}; saved a checkpoint at step {trainer.global_step} to {path}"
            f"{requeued} and exiting with status 0. Resume with trainer.fit(..., ckpt_path='last').",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(0)
