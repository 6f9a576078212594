"""The global generators a dataset draws from: seed them, copy their states out and back in.

Three generators: torch's CPU generator, numpy's legacy global ``RandomState`` (``np.random.*``)
and Python's ``random``. CUDA generators are not touched. The states are copied on every batch
read in the main process, so the copy is made cheap where it can be: numpy's ``get_state`` /
``set_state`` copy the 624-word Mersenne Twister key one word at a time (30-60 µs each way),
while its raw state struct (at numpy's public ``BitGenerator.ctypes.state_address``) copies in
about a microsecond. The struct holds everything but the cached second Gaussian of the legacy
``randn`` (``has_gauss``), so the raw copy is used only where that cache is known to be empty;
otherwise the full ``get_state`` / ``set_state`` path runs (see `_NumpyGlobal`).
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import torch

__all__ = [
    "GeneratorStates",
    "forget_generator_states",
    "get_generator_states",
    "seed_generators",
    "set_generator_states",
]

GeneratorStates = tuple[Any, Any, Any]  # torch, python, numpy (None without numpy)


def _numpy_random() -> Any:
    try:
        import numpy.random as np_random
    except ImportError:  # numpy is optional
        return None
    return np_random


class _NumpyGlobal:
    """numpy's global generator state, copied raw when no Gaussian is cached.

    Why it is safe: the raw struct is the key and position; the Gaussian cache is set only by a
    draw (which changes the raw state) and emptied by seeding. So going forward, a raw state
    equal to one known to have an empty cache still has an empty cache, and putting a raw state
    back after ``seed`` (which empties the cache) restores it exactly when its cache was empty.
    Only setting an older state can go backward; what is known is forgotten then
    (`forget_generator_states`, called at the start of every pass, and on any full ``set``).
    """

    _SIZE = 624 * 4 + 4  # mt19937_state: uint32_t key[624]; int pos

    def __init__(self) -> None:
        self._np = _numpy_random()
        self._address: int | None = None  # set only where the raw copy round-trips
        self._known_raw: bytes | None = None  # a raw state whose Gaussian cache was empty
        get_bit_generator = getattr(self._np, "get_bit_generator", None)  # numpy >= 1.25
        if get_bit_generator is not None and type(get_bit_generator()).__name__ == "MT19937":
            address = get_bit_generator().ctypes.state_address
            self._address = address if self._round_trips(address) else None

    def _round_trips(self, address: int) -> bool:
        """Whether the raw copy restores the state on this numpy (the layout is as expected)."""
        before = self._np.get_state()
        raw = ctypes.string_at(address, self._SIZE)
        self._np.random_sample(700)  # past one refill of the 624-word key
        ctypes.memmove(address, raw, self._SIZE)
        after = self._np.get_state()
        self._np.set_state(before)
        return bool((after[1] == before[1]).all()) and after[2:] == before[2:]

    def get(self, *, portable: bool = False) -> Any:
        if self._np is None:
            return None
        if self._address is None or portable:
            return self._np.get_state()
        raw = ctypes.string_at(self._address, self._SIZE)
        if raw == self._known_raw:
            return raw
        state = self._np.get_state()
        if state[3] == 0:  # no Gaussian cached: the raw copy is the whole state
            self._known_raw = raw
            return raw
        return state

    def set(self, state: Any) -> None:
        if state is None:
            return
        if isinstance(state, bytes):
            self._np.seed(0)  # empties the Gaussian cache; the raw copy sets the rest
            ctypes.memmove(self._address, state, self._SIZE)
            self._known_raw = state
        else:
            self._np.set_state(state)
            self.forget()

    def forget(self) -> None:
        """Drop what is known: a state set elsewhere (``set_state`` of an older state) may
        repeat a known raw state with a Gaussian cached."""
        self._known_raw = None


_numpy_global: _NumpyGlobal | None = None


def _numpy() -> _NumpyGlobal:
    global _numpy_global  # built at first use: `import trainer` draws nothing
    if _numpy_global is None:
        _numpy_global = _NumpyGlobal()
    return _numpy_global


def forget_generator_states() -> None:
    """Call where other code may have set the generators (the Trainer restores them before an
    epoch's first batch): the next copy takes the full path once."""
    if _numpy_global is not None:
        _numpy_global.forget()


def seed_generators(seed: int) -> None:
    """Seed torch's CPU generator, numpy's global generator and ``random`` from one 64-bit seed."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np_random = _numpy_random()
    if np_random is not None:
        np_random.seed(seed & 0xFFFF_FFFF)  # the legacy seed takes 32 bits


def get_generator_states(*, portable: bool = False) -> GeneratorStates:
    """The three generators' states.

    Args:
        portable: numpy's as ``get_state()`` returns it (to store in a checkpoint); otherwise
            possibly its raw struct, valid only in this process: pass it back here.
    """
    numpy_state = _numpy().get(portable=portable)
    return torch.default_generator.get_state(), random.getstate(), numpy_state


def set_generator_states(states: GeneratorStates) -> None:
    """Put back what `get_generator_states` returned."""
    torch_state, python_state, numpy_state = states
    torch.default_generator.set_state(torch_state)
    random.setstate(python_state)
    _numpy().set(numpy_state)
