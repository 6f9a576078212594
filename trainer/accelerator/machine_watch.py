"""The other machines of a multi-machine ``trainer launch``, watched through the rendezvous store.

Owns one thread per launcher (several machines only). Through a client of the TCP store that
torchrun's rendezvous already runs at ``main_process_ip:main_process_port`` it

- publishes this machine's launch settings and compares them with every other machine's (all
  keys but ``machine_rank`` and ``gpu_ids``): a difference, or two machines given one
  ``machine_rank``, ends every machine within seconds with a message naming the key, the values
  and the machines, where torchrun would hang in its rendezvous or run mismatched collectives;
- writes a heartbeat every `HEARTBEAT_EVERY` seconds and reads the others': a machine silent
  for `LOST_AFTER` seconds (killed, out of memory, cut off) ends this one, named;
- after a failure (`MachineWatch.explain_failure`), says which machine failed first or was lost.

It does not start, restart or monitor training processes (torchrun's agent does); it only kills
this machine's own when it ends the launcher.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from trainer.accelerator.launch_config import LaunchConfig

__all__ = ["HEARTBEAT_EVERY", "LOST_AFTER", "MachineWatch", "child_processes", "training_processes"]

HEARTBEAT_EVERY = 1.0  # seconds between heartbeats
LOST_AFTER = 10.0  # seconds without a heartbeat after which a machine counts as lost
_PREFIX = "trainer_launch"
_NOT_COMPARED = ("machine_rank", "gpu_ids")  # may differ from machine to machine


def child_processes(parent: int | None = None) -> list[tuple[int, str]]:
    """``(pid, state)`` of each child of ``parent`` (default: this process), read from
    ``/proc`` (state "Z": ended, its status not yet collected). Empty where there is no ``/proc``."""
    parent = os.getpid() if parent is None else parent
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                state, its_parent = stat.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):  # gone meanwhile
            continue
        if int(its_parent) == parent:
            found.append((int(entry), state))
    return found


def training_processes(parent: int | None = None) -> list[int]:
    """The training processes torchrun's agent in ``parent`` (default: this process) started.

    The agent starts each in its own session, so a signal to the launcher's process group does
    not reach them: they are the children whose environment has ``TORCHELASTIC_RUN_ID``, read
    from ``/proc`` (other children, such as a notebook's, are left alone; an ended one's
    environment cannot be read). Empty where there is no ``/proc`` (not Linux).
    """
    found = []
    for pid, _ in child_processes(parent):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if b"TORCHELASTIC_RUN_ID=" in environ.read():
                    found.append(pid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


class MachineWatch:
    """This launcher's view of the other machines of the job (see the module docstring).

    Args:
        machine_rank: this machine's ``machine_rank``.
        num_machines: how many machines the job has.
        address: the rendezvous store's host (``main_process_ip``).
        port: its port (``main_process_port``).
        settings: what every machine must agree on (compared as JSON values).
    """

    def __init__(
        self, *, machine_rank: int, num_machines: int, address: str, port: int,
        settings: dict[str, Any],
    ) -> None:  # fmt: skip
        self.machine_rank = machine_rank
        self.num_machines = num_machines
        self.address, self.port = address, port
        self._identity = {
            "token": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "settings": settings,
        }
        self._store: TCPStore | None = None
        self._seen: dict[int, dict[str, Any]] = {}  # machine -> its published identity
        self._beats: dict[int, tuple[int, float]] = {}  # machine -> (count, when it last moved)
        self._notes: dict[int, str] = {}  # machine -> what it said when it ended
        self._has_noted = False  # this machine told the others how it ended
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainer-machine-watch", daemon=True)

    @classmethod
    def for_config(cls, config: LaunchConfig, *, max_restarts: int = 0) -> MachineWatch | None:
        """The watch for ``config``'s machine; None for a one-machine launch."""
        if config.num_machines < 2:
            return None
        settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_COMPARED}
        settings["max_restarts"] = max_restarts
        return cls(
            machine_rank=config.machine_rank, num_machines=config.num_machines,
            address=str(config.main_process_ip), port=config.main_process_port or 29500,
            settings=settings,
        )  # fmt: skip

    # ---- the thread -------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching (the store is reached once torchrun's rendezvous created it)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching after this machine ended normally; tell the others it did."""
        if self._thread.is_alive():
            self._stopping.set()
            self._thread.join(timeout=5)
        if not self._has_noted:
            self._post_note("done")

    def _run(self) -> None:
        while self._store is None and not self._stopping.is_set():
            self._connect(timeout=5.0)
        if self._stopping.is_set():
            return
        self._publish()
        unreachable_since: float | None = None
        while not self._stopping.wait(HEARTBEAT_EVERY):
            try:
                self._beat_and_read()
                unreachable_since = None
            except (RuntimeError, OSError, AttributeError):  # the store's host went away
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since >= LOST_AFTER:
                    self._end(self._unreachable_store())
                self._connect(timeout=1.0)
                continue
            problem = self._disagreement() or self._lost_machine()
            if problem:
                self._end(problem)

    def _connect(self, *, timeout: float) -> None:
        from torch.distributed import TCPStore

        try:
            self._store = TCPStore(
                self.address, self.port, None, False, dt.timedelta(seconds=timeout),
                wait_for_workers=False,
            )  # fmt: skip
        except (RuntimeError, OSError):  # not created yet, or gone: try again
            self._store = None

    def _publish(self) -> None:
        """Claim this machine_rank with this launcher's identity and settings."""
        payload = json.dumps(self._identity, sort_keys=True, default=str)
        key = f"{_PREFIX}/machine/{self.machine_rank}"
        claimed = json.loads(self._store.compare_set(key, "", payload))
        if claimed["token"] != self._identity["token"]:
            self._end(
                f"two machines were started with machine_rank {self.machine_rank}: "
                f"{self._where(claimed)} and this one ({self._where(self._identity)}). Give "
                f"each machine its own machine_rank, from 0 to {self.num_machines - 1}."
            )

    def _beat_and_read(self) -> None:
        store = self._store
        store.add(f"{_PREFIX}/beat/{self.machine_rank}", 1)
        now = time.monotonic()
        for machine in range(self.num_machines):
            if machine == self.machine_rank:
                continue
            keys = [f"{_PREFIX}/{kind}/{machine}" for kind in ("machine", "beat", "note")]
            if machine not in self._seen and store.check([keys[0]]):
                self._seen[machine] = json.loads(store.get(keys[0]))
            if store.check([keys[1]]):
                count = int(store.get(keys[1]))
                if self._beats.get(machine, (None, 0.0))[0] != count:
                    self._beats[machine] = (count, now)
            if store.check([keys[2]]):
                self._notes[machine] = store.get(keys[2]).decode()

    # ---- what is wrong ----------------------------------------------------------------------
    def _disagreement(self) -> str | None:
        mine = self._identity["settings"]
        for machine, other in sorted(self._seen.items()):
            theirs = other["settings"]
            keys = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
            if keys:
                values = "; ".join(
                    f"{k}={theirs.get(k)!r} on machine_rank {machine}, {k}={mine.get(k)!r} here"
                    for k in keys
                )
                return (
                    f"the machines were started with different settings: {values}. Start every "
                    "machine with the same launch config and flags; only machine_rank (and "
                    "gpu_ids) may differ."
                )
        return None

    def _lost_machine(self) -> str | None:
        now = time.monotonic()
        for machine, (_, moved) in sorted(self._beats.items()):
            if machine not in self._notes and now - moved >= LOST_AFTER:
                return (
                    f"machine_rank {machine} ({self._where(self._seen.get(machine))}) was lost: "
                    f"no heartbeat for {now - moved:.0f} s (killed, out of memory, or cut off "
                    "from the network). Ending this machine's processes; restart the job (with "
                    "fit(ckpt_path='last') it resumes from the newest checkpoint)."
                )
        return None

    def _unreachable_store(self) -> str:
        return (
            f"machine_rank 0 was lost: the rendezvous store it holds at {self.address}:"
            f"{self.port} stopped answering (killed, out of memory, or cut off from the "
            "network). Ending this machine's processes."
        )

    @staticmethod
    def _where(identity: dict[str, Any] | None) -> str:
        return "host unknown" if not identity else f"host {identity['host']}, pid {identity['pid']}"

    # ---- ending -----------------------------------------------------------------------------
    def _post_note(self, note: str) -> None:
        self._has_noted = True
        try:
            if self._store is not None:
                self._store.set(f"{_PREFIX}/note/{self.machine_rank}", note)
        except (RuntimeError, OSError):  # nobody left to tell
            pass

    def _end(self, message: str) -> None:
        """End this launcher now: say why, tell the others, kill this machine's processes."""
        if self._stopping.is_set():  # the launcher is finishing: its own report wins
            return
        print(
            f"trainer launch (machine_rank {self.machine_rank}): {message}",
            file=sys.stderr,
            flush=True,
        )
        self._post_note(f"ended: {message}")
        for pid in training_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        if self.machine_rank == 0:  # the store lives here: let the others read the note
            time.sleep(2 * HEARTBEAT_EVERY)
        os._exit(1)

    def explain_failure(self, error: ChildFailedError) -> str:
        """After this machine's processes failed: which machine failed first, or was lost.

        Publishes this machine's failure, then waits until every other machine has either
        ended (and said why), shown a heartbeat, or been silent for `LOST_AFTER` seconds.

        Returns:
            Lines to print after torchrun's report (empty when there is nothing to add).
        """
        self._stopping.set()
        self._thread.join(timeout=5)
        if not self._seen:  # never met the others: nothing to add
            return ""
        rank, failure = error.get_first_failure()
        self._post_note(f"failed: rank {rank} exited with {failure.exitcode}")
        start = time.monotonic()
        others = set(range(self.num_machines)) - {self.machine_rank}
        lines, lost = [], None
        while time.monotonic() - start < LOST_AFTER + 2 * HEARTBEAT_EVERY:
            try:
                self._beat_and_read()
            except (RuntimeError, OSError, AttributeError):
                if 0 not in self._notes:
                    lines.append(self._unreachable_store().split(" Ending")[0])
                break
            lost = self._lost_machine()
            alive = {m for m, (_, moved) in self._beats.items() if moved > start}
            if lost or not others - alive - set(self._notes):
                break
            time.sleep(HEARTBEAT_EVERY / 2)
        if lost:
            lines.append(lost.split(" Ending")[0])
        for machine, note in sorted(self._notes.items()):
            if note != "done":
                lines.append(f"machine_rank {machine} reported: {note}")
        if self.machine_rank == 0 and others - set(self._notes):
            time.sleep(2 * HEARTBEAT_EVERY)  # the store lives here: let the others read the note
        prefix = f"\ntrainer launch (machine_rank {self.machine_rank}): "
        return "".join(prefix + line for line in lines)
