"""How long the process groups live, and who lets go of them before they end (issue #13).

A process group alive when Python shuts down can abort the process ("terminate called without an
active exception"): the group's destructor joins its gloo worker threads, and one of them that
frees a just-finished collective's tensors needs the GIL, which finalization no longer gives. So
the groups this package starts are ended, and freed, while the interpreter is fully alive:

- `hold_no_group_in_default_arguments` runs before every group starts, so that torch's own
  default arguments never hold one;
- `release_with_groups` / `release_mesh_with_groups`: what holds a group beyond Python's
  collector (DeepSpeed's engines, DeviceMesh registries) lets go of it just before it ends;
- `destroy_default_group` ends the groups; `track_wrapper` keeps them while a DDP wrapper's C++
  Reducer holds them (see `_LIVE_WRAPPERS`);
- `register_exit_fallback`: for a run that failed or never ended its group, an exit hook does
  all of the above, then keeps for ever every ended group that something still holds (a Trainer
  kept in a module-level variable holds its FSDP module or DeepSpeed engine, and so the group):
  freed later, during finalization, it would abort the process.

What it does not own: starting the groups (the strategies) and what a strategy does when it
ends its own (`DDPStrategy.end_process_group`).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "destroy_default_group",
    "hold_no_group_in_default_arguments",
    "register_exit_fallback",
    "release_group_holders",
    "release_mesh_with_groups",
    "release_with_groups",
    "track_wrapper",
]


def hold_no_group_in_default_arguments() -> None:
    """Import ``torch.distributed.nn.functional`` while no process group exists; call before
    ``init_process_group``.

    Its functions declare ``group=group.WORLD`` as a default argument, evaluated on import. DDP
    imports it lazily, after the group exists, so the first group stayed referenced for ever:
    ``destroy_process_group`` could not free it, its gloo worker threads lived on, and one that
    released a finished collective's tensors during interpreter shutdown aborted the process
    ("terminate called without an active exception", issue #13). Imported first, the defaults
    are None (the current group at call time).
    """
    import torch.distributed.nn.functional  # noqa: F401


@functools.cache
def register_exit_fallback() -> None:
    """Once per process: end a group still open at exit (a failed run, no ``end_training``)."""
    atexit.register(_destroy_process_group_at_exit)


def _destroy_process_group_at_exit() -> None:
    """The fallback: release the groups' holders, collect dead wrappers and engines, then end the
    groups (the order avoids an abort: the groups are freed, their threads joined, before
    the interpreter shuts down)."""
    release_group_holders()
    # Always collect, also after a clean end: a group ended earlier may still be referenced from
    # a cycle (a background save's futures, say); freed later, during interpreter shutdown, its
    # gloo threads abort the process ("terminate called without an active exception": skipping
    # this collection did that in 1 of ~3 runs of the async FSDP kill tests). 0.1-0.3 s per exit.
    gc.collect()
    if dist.is_initialized():
        destroy_default_group()
    release_ended_groups()
    # An ended group that something still holds (a module-level Trainer's FSDP module or
    # DeepSpeed engine, a user's own reference) would be freed during finalization: keep it.
    for group in list(_ENDED_ALIVE):
        if not any(group is kept for kept in _ENDED_GROUPS):
            _ENDED_GROUPS.append(group)
    if _ENDED_GROUPS:  # never free these groups (see `_LIVE_WRAPPERS`)
        time.sleep(0.05)  # GIL released: a worker finishing a collective's cleanup gets it now
        for group in _ENDED_GROUPS:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


# Every DDP wrapper built here, and the groups ended while one of them was alive. A wrapper's
# C++ Reducer holds its group; released last by the Reducer, the group's destructor joins the
# gloo worker threads with the GIL held (pybind frees a Reducer without releasing it). A worker
# still freeing a finished collective launched during backward needs the GIL for that (torch
# stashes a Python context in the work's thread-local state), so the process hangs at exit.
# Kept here, the Reducer's release is not the last one; ours is, through the Python group
# object, whose release lets go of the GIL while the threads are joined.
_LIVE_WRAPPERS: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
_ENDED_GROUPS: list[Any] = []
# Every group this package ended, weakly: one still alive at exit is held by something else.
_ENDED_ALIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def track_wrapper(wrapper: DistributedDataParallel) -> DistributedDataParallel:
    """Keep the groups ``wrapper`` runs on from being freed by its Reducer (`_LIVE_WRAPPERS`)."""
    _LIVE_WRAPPERS.add(wrapper)
    return wrapper


# What must let go of the process groups before this package ends them (`release_with_groups`).
_GROUP_HOLDERS: list[Callable[[], None]] = []
_MESHES: weakref.WeakSet[Any] = weakref.WeakSet()  # meshes whose groups `_release_meshes` drops


def release_with_groups(release: Callable[[], None]) -> None:
    """Have ``release`` run each time this package ends the process groups, before it does.

    For what holds a group beyond Python's collector (DeepSpeed's engines, in reference cycles
    through autograd's C++ nodes): a group still held when it ends is not freed, and its gloo
    threads live on into interpreter shutdown, where one that frees a just-finished
    collective's tensors aborts the process. Registering the same function again is a no-op.
    """
    if release not in _GROUP_HOLDERS:
        _GROUP_HOLDERS.append(release)


def release_mesh_with_groups(mesh: Any) -> Any:
    """``mesh`` (a DeviceMesh), made to let go of its process groups when this package ends them.

    A mesh keeps its groups in a registry of its own and is itself kept by DTensor's sharding
    caches, so without this its groups outlive ``destroy_process_group`` (`release_with_groups`
    says what that costs). Returns ``mesh``.
    """
    _MESHES.add(mesh)
    release_with_groups(_release_meshes)
    return mesh


def _release_meshes() -> None:
    for mesh in list(_MESHES):
        registry = getattr(mesh, "_pg_registry", None)  # torch's name -> ProcessGroup map
        if isinstance(registry, dict):
            registry.clear()
    _MESHES.clear()


def release_group_holders() -> None:
    """Run every `release_with_groups` function (the groups are about to end)."""
    for release in _GROUP_HOLDERS:
        release()


def destroy_default_group() -> None:
    """``destroy_process_group()``, keeping the ended groups while a DDP wrapper lives."""
    release_ended_groups()
    # torch has no public API to list the groups
    groups = list(getattr(dist.distributed_c10d._world, "pg_map", {}))  # noqa: SLF001
    dist.destroy_process_group()
    _ENDED_ALIVE.update(groups)
    if len(_LIVE_WRAPPERS):
        _ENDED_GROUPS.extend(groups)
    # else: ``groups`` holds the last references; they go (GIL released) when this returns


def release_ended_groups() -> None:
    """Free the ended groups once no DDP wrapper built here is alive."""
    if _ENDED_GROUPS and not len(_LIVE_WRAPPERS):
        _ENDED_GROUPS.clear()
