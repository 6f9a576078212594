"""Seeding and RNG-state helpers: every generator a run draws from, set or read in one place.

``seed_everything`` follows Lightning 2.6's ``seed_everything``, with ``TRAINER_GLOBAL_SEED`` in the
place of ``PL_GLOBAL_SEED``: the seed it sets is written there, so processes started from this
one (and a later call with no seed) use the same seed.
"""

from __future__ import annotations

import logging
import operator
import os
import random
from typing import Any

import torch

from trainer.utilities import launcher_rank

__all__ = [
    "SEED_ENV",
    "get_rng_states",
    "seed_everything",
    "set_rng_states",
    "set_seed",
    "synchronize_rng_states",
]

SEED_ENV = "TRAINER_GLOBAL_SEED"  # Lightning: PL_GLOBAL_SEED
_MAX_SEED = 2**32 - 1
_log = logging.getLogger(__name__)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Accelerate's ``set_seed``: seed Python's ``random``, NumPy and torch with ``seed``.

    ``device_specific=True`` adds this process's rank, so each process draws differently;
    ``deterministic=True`` also calls ``torch.use_deterministic_algorithms(True)``. The same as
    `seed_everything` otherwise (which the Trainer's ``seed=`` uses), without its log line.

    Raises:
        ConfigurationError: the seed (plus the rank) is not an int in [0, 2**32 - 1].

    Examples:
        >>> set_seed(42); first = torch.rand(2)
        >>> set_seed(42); bool(torch.equal(first, torch.rand(2)))
        True
    """
    if device_specific:
        from trainer.runtime.state import PartialState

        seed = operator.index(seed) + PartialState().process_index
    seed_everything(seed, verbose=False, deterministic=deterministic)


def seed_everything(
    seed: int | None = None,
    workers: bool = False,
    verbose: bool = True,
    *,
    deterministic: bool = False,
) -> int:
    """Seed Python's ``random``, NumPy (if installed) and torch (CPU and every CUDA device).

    With no ``seed`` (Lightning's behaviour), the seed is read from the ``TRAINER_GLOBAL_SEED``
    environment variable; when that is unset too, the seed is 0 and a ``UserWarning`` says so
    ("No seed found, seed set to 0", on global rank zero). The seed used is written to
    ``TRAINER_GLOBAL_SEED`` and ``PYTHONHASHSEED`` for processes started from this one, and
    logged ("Seed set to 42", logger ``trainer.runtime.seed``, level INFO) when ``verbose``.

    Args:
        seed: an int in [0, 2**32 - 1] (a NumPy integer works too), or None.
        workers: accepted for Lightning compatibility: the Trainer's DataLoader workers are
            always seeded from the run's seed (docs/checkpointing.md), as ``workers=True`` asks.
        verbose: log the seed that was set.
        deterministic: also call ``torch.use_deterministic_algorithms(True)``.

    Returns:
        The seed that was set.

    Raises:
        ConfigurationError: ``seed`` (or ``TRAINER_GLOBAL_SEED``) is not an int in
            [0, 2**32 - 1]; the message names where the value came from.

    Examples:
        >>> seed_everything(42)
        42
        >>> os.environ["TRAINER_GLOBAL_SEED"] = "7"
        >>> seed_everything()
        7
    """
    seed = _resolve_seed(seed)
    if verbose:
        _log.info("Seed set to %d", seed)
    os.environ[SEED_ENV] = str(seed)
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


def _resolve_seed(seed: object) -> int:
    """The seed to set: ``seed``, else the environment's, else 0 with a warning (Lightning's rule)."""
    from trainer._warnings import warn_user
    from trainer.errors import ConfigurationError, describe

    where = f"seed_everything(seed={seed!r})"
    if seed is None:
        text = os.environ.get(SEED_ENV)
        if text is None:
            if _is_rank_zero():
                warn_user("No seed found, seed set to 0")
            return 0
        where = f"the environment variable {SEED_ENV}"
        try:
            seed = int(text)
        except ValueError:
            seed = text
    try:
        value = operator.index(seed) if not isinstance(seed, bool) else None
    except TypeError:
        value = None
    if value is None or not 0 <= value <= _MAX_SEED:
        raise ConfigurationError(
            f"{where}: expected an int in [0, {_MAX_SEED}], received {describe(seed)}. "
            "Pass an int seed such as 42."
        )
    return value


def _is_rank_zero() -> bool:
    """Whether this is global rank zero, from the launcher's environment (as Lightning reads it)."""
    return launcher_rank() in (None, 0)


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
