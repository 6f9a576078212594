"""SIGTERM / SIGUSR1 during fit: finish the optimizer step, save a checkpoint, exit with status 0.

With ``AsyncCheckpointIO`` the save in flight completes first, then this one, before the exit.

Clusters (SLURM, Kubernetes) send SIGTERM before killing a job; SLURM can send SIGUSR1 ahead of
time (``#SBATCH --signal=USR1@90``). The handler only records the signal; the fit loop acts on it
at the next optimizer-step boundary, so the saved state is consistent.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from trainer.trainer.checkpoint_state import checkpoint_dir

if TYPE_CHECKING:
    from trainer.trainer.trainer import Trainer

__all__ = [
    "PREEMPTION_SIGNALS",
    "PreemptionSignal",
    "catch_preemption_signals",
    "is_preempted",
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
def catch_preemption_signals() -> Iterator[PreemptionSignal]:
    """Record SIGTERM/SIGUSR1 in the yielded `PreemptionSignal` inside the block.

    Signal handlers can only be set in the main thread; elsewhere nothing is recorded.
    """
    received = PreemptionSignal()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def record(signum: int, frame: object) -> None:
        received.signum = signum

    previous = {sig: signal.signal(sig, record) for sig in PREEMPTION_SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def is_preempted(trainer: Trainer, received: PreemptionSignal) -> bool:
    """Whether any process got SIGTERM/SIGUSR1 (all must agree to save together).

    Answered only where an optimizer step just completed, so an accumulation window is never
    split; with several processes, every `CHECK_EVERY` steps (a collective every step would
    cost), at the same steps on every process.
    """
    if not trainer.accelerator.sync_gradients:
        return False
    seen = received.signum is not None
    if trainer.world_size == 1:
        return seen
    if trainer.global_step % CHECK_EVERY != 0:
        return False
    agreed = trainer.strategy.reduce_boolean_decision(seen, all=False)
    if agreed and not seen:
        received.signum = int(signal.SIGTERM)
    return agreed


def save_and_exit(trainer: Trainer, received: PreemptionSignal) -> None:
    """Save where training stands, say so on stderr, and end the process with status 0."""
    name = signal.Signals(received.signum).name
    path = (
        checkpoint_dir(trainer)
        / f"preempted-epoch={trainer.current_epoch}-step={trainer.global_step}"
    )
    pending = trainer.save_checkpoint(path)
    if pending is not None:  # a background save (AsyncCheckpointIO): exit only once it is complete
        pending.wait()
    if trainer.is_global_zero:
        print(
            f"trainer: received {name}; saved a checkpoint at step {trainer.global_step} to {path} "
            "and exiting with status 0. Resume with trainer.fit(..., ckpt_path='last').",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(0)
