"""Stopping a process whose launcher died without stopping it.

torchrun's agent (run by ``trainer launch``, ``Trainer(devices=N)``'s relaunch, a notebook
launcher or plain ``torchrun``) starts each training process in its own session. When the agent
is killed with SIGKILL (``kill -9``, the out-of-memory killer, a container runtime that kills
only the process it started) nothing stops them: they train on unwatched, and keep writing
checkpoints that a resubmitted job reads. `watch_launcher` gives each such process a daemon
thread that notices its parent is gone (checked once a second) and sends the process SIGTERM:
during ``fit`` that is a preemption (a checkpoint, then exit), elsewhere it ends the process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

__all__ = ["CHECK_EVERY", "watch_launcher"]

CHECK_EVERY = 1.0  # seconds between looks at the parent
_watching: int | None = None  # the parent being watched in this process, once started


def watch_launcher() -> bool:
    """Start watching this process's launcher, once per process; only under torchrun's agent
    (``TORCHELASTIC_RUN_ID`` set) and where SIGTERM exists. Returns whether a watch runs."""
    global _watching
    if _watching is not None:
        return _watching == os.getppid()
    if "TORCHELASTIC_RUN_ID" not in os.environ or not hasattr(signal, "SIGTERM"):
        return False
    _watching = parent = os.getppid()
    threading.Thread(
        target=_stop_when_parent_ends, args=(parent,), name="trainer-launcher-watch", daemon=True
    ).start()
    return True


def _stop_when_parent_ends(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(CHECK_EVERY)
    rank = os.environ.get("RANK", "?")
    print(
        f"trainer: rank {rank}: the launcher that started this process (pid {parent}) has ended "
        "without stopping it; sending this process SIGTERM (during fit: a preemption checkpoint, "
        "then exit).",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGTERM)
