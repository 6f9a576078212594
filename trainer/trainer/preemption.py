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

__all__ = ["PREEMPTION_SIGNALS", "catch_preemption_signals", "save_and_exit"]

PREEMPTION_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None
)


@contextlib.contextmanager
def catch_preemption_signals(trainer: Trainer) -> Iterator[None]:
    """Record SIGTERM/SIGUSR1 in ``trainer._received_signal`` inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    trainer._received_signal = None

    def record(signum: int, frame: object) -> None:
        trainer._received_signal = signum

    previous = {sig: signal.signal(sig, record) for sig in PREEMPTION_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def save_and_exit(trainer: Trainer) -> None:
    """Save where training stands, say so on stderr, and end the process with status 0."""
    name = signal.Signals(trainer._received_signal).name
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
