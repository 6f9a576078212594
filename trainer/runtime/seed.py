"""Seeding and RNG-state helpers: every generator a run draws from, set or read in one place."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

__all__ = ["get_rng_states", "seed_everything", "set_rng_states", "synchronize_rng_states"]

_MAX_SEED = 2**32 - 1


def seed_everything(seed: int, *, deterministic: bool = False) -> int:
    """Seed Python's ``random``, NumPy (if installed) and torch (CPU and every CUDA device).

    Also sets ``PYTHONHASHSEED`` for worker processes. Returns the seed.

    Examples:
        >>> seed_everything(42)
        42
    """
    from trainer.errors import ConfigurationError, describe

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise ConfigurationError(f"seed={describe(seed)}: expected an int in [0, {_MAX_SEED}].")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)  # seeds every CUDA device too
    if deterministic:
        torch.use_deterministic_algorithms(True)
    return seed


def get_rng_states() -> dict[str, Any]:
    """The state of every generator this process draws from (python, numpy, torch, cuda)."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        states["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `get_rng_states` returned."""
    if "python" in states:
        random.setstate(states["python"])
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def synchronize_rng_states(
    rng_types: list[str] | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the main process's RNG state for ``rng_types`` ("torch", "cuda", "generator").

    With one process this is a no-op. Used so shuffling is identical on every process.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for rng_type in rng_types or ["torch"]:
        if rng_type == "torch":
            state = [torch.get_rng_state()]
            dist.broadcast_object_list(state, src=0)
            torch.set_rng_state(state[0])
        elif rng_type == "cuda" and torch.cuda.is_available():
            state = [torch.cuda.get_rng_state()]
            dist.broadcast_object_list(state, src=0)
            torch.cuda.set_rng_state(state[0])
        elif rng_type == "generator" and generator is not None:
            state = [generator.get_state()]
            dist.broadcast_object_list(state, src=0)
            generator.set_state(state[0])
