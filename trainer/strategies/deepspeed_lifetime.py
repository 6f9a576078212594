"""How long DeepSpeed's engines live: until the process group they run on ends.

Python's collector never frees a DeepSpeed engine: ZeRO's gradient hooks sit on the parameters'
autograd nodes (C++) and point back at the engine's optimizer, a reference cycle the collector
cannot see. So every engine stays alive, with the copy of the world group that DeepSpeed makes
for ZeRO (also cached in ``deepspeed.utils.groups``) and, through its module's ``trainer``, the
Trainer and its strategy. Ending the process group then frees neither group: their gloo worker
threads run on into interpreter shutdown, and one that releases a just-finished collective's
tensors there aborts the process ("terminate called without an active exception"). A fit refused
at restore shortly before a script ended did that (issue #13): the last thing it does is the
ranks' all-gather agreeing on the refusal.

What this file owns: recording every engine built (`track_engine`, called by
``deepspeed_engine.initialize_engine``), and `release_engines`,
which runs before this package ends the process groups (``DDPStrategy.end_process_group``, the
exit fallback): it destroys those engines (``engine.destroy()`` removes the hooks, so the
collector frees them) and drops DeepSpeed's cached groups, so that the groups are freed, their
threads joined, while Python is alive, and an engine built later copies the new world group, not
the ended one.

What it does not own: building the engine (``deepspeed_engine.py``) and ending the groups
(``group_lifetime.py``).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from trainer.strategies.group_lifetime import release_with_groups

__all__ = ["release_engines", "track_engine"]

_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()  # engines built here, not destroyed yet


def track_engine(engine: Any) -> None:
    """Record ``engine`` so that it is destroyed when the process group ends (`release_engines`)."""
    _ENGINES.add(engine)
    release_with_groups(release_engines)


def release_engines() -> None:
    """Destroy every engine built here that is still alive and drop DeepSpeed's cached groups.

    Called just before the process groups end: an engine cannot run without its group.
    """
    engines = list(_ENGINES)
    _ENGINES.clear()
    for engine in engines:
        engine.destroy()
    groups = sys.modules.get("deepspeed.utils.groups")
    # What deepspeed.comm.destroy_process_group() does after it ends the world group (the groups
    # here end through torch.distributed); DeepSpeed releases without it keep their cache.
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(None)
