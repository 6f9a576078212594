"""Several dataloaders read together: Lightning's ``CombinedLoader`` and the fit's prepared form.

`CombinedLoader(iterables, mode)` holds a dict / list / tuple (nested as deep as wanted) of
iterables and reads them in one of Lightning's modes:

- ``"min_size"``: one batch of each per step; stops when the shortest is exhausted.
- ``"max_size_cycle"``: stops after the longest; a shorter one starts a new pass when it is
  exhausted (what ``Trainer.fit`` does with a dict or list of train loaders).
- ``"max_size"``: stops after the longest; an exhausted one gives ``None``.
- ``"sequential"``: one loader after the other (evaluation's way: ``dataloader_idx``).

Iterated on its own it yields ``(batch, batch_idx, dataloader_idx)``, as Lightning's does; the
batch has the structure of ``iterables`` with one batch at each leaf.

`PreparedCombinedLoader` is what ``Trainer.fit`` trains on when it is given several train
loaders (and what an evaluation reads for a `CombinedLoader` in one of those modes): each one
prepared alone (sharded, seeded, moved), read together in one of the first three modes. To the fit loop and the Accelerator's `GradientState` it is one loader (its last
batch ends the epoch, not a shorter loader's), it applies the batch-transfer hooks to the whole
batch (Lightning calls them once, with ``dataloader_idx=0``), and a resumed fit continues each
loader where it stood: batch ``k`` of the epoch is batch ``k`` of each loader (``k`` modulo its
length in ``"max_size_cycle"``, which also counts its finished passes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from trainer.errors import CheckpointError, ConfigurationError, describe

__all__ = ["MODES", "CombinedLoader", "PreparedCombinedLoader", "flatten", "unflatten"]

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")
TRAINING_MODES = ("min_size", "max_size_cycle", "max_size")


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """The leaves of nested dicts / lists / tuples, in order, and the structure to rebuild it.

    As in Lightning, a container of plain values only (ints, floats, strs; a list used as a
    dataset) is a leaf.
    """
    if _is_plain_container(tree):
        return [tree], None
    if isinstance(tree, dict):
        leaves: list[Any] = []
        spec = []
        for key, value in tree.items():
            child_leaves, child_spec = flatten(value)
            leaves.extend(child_leaves)
            spec.append((key, child_spec, len(child_leaves)))
        return leaves, (type(tree), spec)
    if isinstance(tree, list | tuple) and not hasattr(tree, "_fields"):
        leaves, spec = [], []
        for value in tree:
            child_leaves, child_spec = flatten(value)
            leaves.extend(child_leaves)
            spec.append((None, child_spec, len(child_leaves)))
        return leaves, (type(tree), spec)
    return [tree], None


def _is_plain_container(tree: Any) -> bool:
    values = tree.values() if isinstance(tree, dict) else tree
    return isinstance(tree, dict | list | tuple) and all(
        isinstance(value, int | float | str) for value in values
    )


def unflatten(leaves: list[Any], spec: Any) -> Any:
    """Rebuild `flatten`'s structure with ``leaves`` at its leaves."""
    if spec is None:
        return leaves[0]
    kind, children = spec
    values, start = [], 0
    for key, child_spec, count in children:
        values.append((key, unflatten(leaves[start : start + count], child_spec)))
        start += count
    if issubclass(kind, dict):
        return kind((key, value) for key, value in values)
    return kind(value for _, value in values)


def check_mode(mode: object, where: str, modes: tuple[str, ...] = MODES) -> str:
    """``mode`` when it is one of ``modes``; else a ConfigurationError naming ``where``."""
    if mode not in modes:
        raise ConfigurationError(
            f"{where}: mode={mode!r} is not one of {list(modes)}. "
            + (
                "Training reads its loaders together: use 'max_size_cycle' (the default for a "
                "dict or list of train loaders), 'min_size' or 'max_size'."
                if modes == TRAINING_MODES
                else "Pick one of them, e.g. CombinedLoader(loaders, mode='max_size_cycle')."
            )
        )
    return mode  # type: ignore[return-value]


def combined_length(lengths: list[float], mode: str) -> float:
    """Batches in one pass of the combined loader (``inf`` when an infinite one decides it)."""
    if not lengths:
        return 0
    if mode == "min_size":
        return min(lengths)
    if mode == "sequential":
        return sum(lengths)
    return max(lengths)


def _length(iterable: Any) -> float:
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return math.inf


class CombinedLoader:
    """Iterate several iterables together (Lightning's ``CombinedLoader``).

    Args:
        iterables: a dict, list or tuple of iterables (DataLoaders), nested as deep as wanted.
        mode: ``"min_size"`` (default), ``"max_size_cycle"``, ``"max_size"`` or
            ``"sequential"``; see the module docstring.

    Raises:
        ConfigurationError: an unknown ``mode``.

    Examples:
        >>> loader = CombinedLoader({"a": range(4), "b": range(2)}, mode="max_size_cycle")
        >>> [batch for batch, _, _ in loader]
        [{'a': 0, 'b': 0}, {'a': 1, 'b': 1}, {'a': 2, 'b': 0}, {'a': 3, 'b': 1}]
        >>> len(loader)
        4
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        self._mode = check_mode(mode, "CombinedLoader")
        self._iterables = iterables
        self._flattened, self._spec = flatten(iterables)

    @property
    def mode(self) -> str:
        """The mode the iterables are read in."""
        return self._mode

    @property
    def iterables(self) -> Any:
        """The iterables, in the structure given."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list, in order (position = ``dataloader_idx``)."""
        return list(self._flattened)

    def __len__(self) -> int:
        """Batches in one pass in this mode.

        Raises:
            TypeError: the length is infinite (an iterable without a length decides it).
        """
        length = combined_length([_length(item) for item in self._flattened], self._mode)
        if math.isinf(length):
            raise TypeError(f"CombinedLoader(mode={self._mode!r}) has no length: {self!r}")
        return int(length)

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        if self._mode == "sequential":
            for dataloader_idx, iterable in enumerate(self._flattened):
                for batch_idx, batch in enumerate(iterable):
                    yield batch, batch_idx, dataloader_idx
            return
        restart = [lambda item=item: iter(item) for item in self._flattened]
        batches = read_together(restart, self._mode, [False] * len(restart))
        for batch_idx, leaves in enumerate(batches):
            yield unflatten(leaves, self._spec), batch_idx, 0

    def __repr__(self) -> str:
        return f"CombinedLoader({self._iterables!r}, mode={self._mode!r})"


_END = object()


def read_together(
    restart: list[Callable[[], Iterator[Any]]], mode: str, consumed: list[bool]
) -> Iterator[list[Any]]:
    """Batches of several iterators read together in ``mode`` (not "sequential"), as lists.

    ``restart[i]()`` opens a pass of iterable ``i`` (again, in "max_size_cycle", when it is
    exhausted). ``consumed[i]``: iterable ``i`` already finished a pass ("max_size_cycle" ends
    when every one has).
    """
    iterators: list[Iterator[Any] | None] = [open_pass() for open_pass in restart]
    while True:
        leaves: list[Any] = []
        for i, iterator in enumerate(iterators):
            batch = _END if iterator is None else next(iterator, _END)
            if batch is _END:
                if mode == "min_size":
                    return
                if mode == "max_size":
                    iterators[i] = None
                    leaves.append(None)
                    continue
                consumed[i] = True
                if all(consumed):
                    return
                iterators[i] = restart[i]()
                batch = next(iterators[i], _END)  # type: ignore[arg-type]
                if batch is _END:  # an empty iterable: nothing to cycle
                    return
            leaves.append(batch)
        if mode == "max_size" and all(iterator is None for iterator in iterators):
            return
        yield leaves


class PreparedCombinedLoader:
    """The fit's train loader made of several prepared loaders (`DataLoaderShard`).

    It stands where one prepared loader stands: ``set_epoch``, ``skip_batches`` (a resumed
    position), ``limit``, ``end_of_dataloader``, ``state_dict`` / ``load_state_dict``,
    ``end_workers``, ``len``. Its loaders report nothing to the `GradientState`; it does.

    Args:
        loaders: the prepared loaders, in `flatten` order.
        spec: the structure to rebuild each batch in (from `flatten`).
        mode: "min_size", "max_size_cycle" or "max_size".
        counts: each loader's batch count under ``limit_train_batches`` (``inf``: unsized).
        gradient_state: told of each batch and of the end, as a prepared loader tells it.
        transform: applied to each whole batch (the batch-transfer hooks), or None.
    """

    def __init__(
        self,
        loaders: list[Any],
        spec: Any,
        mode: str,
        counts: list[float],
        *,
        gradient_state: Any | None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.loaders = loaders
        self.mode = check_mode(mode, "PreparedCombinedLoader", TRAINING_MODES)
        self._spec = spec
        self.gradient_state = gradient_state
        self.transform = transform
        self.remainder = -1
        length = combined_length(counts, mode)
        self.limit: int | None = None if math.isinf(length) else int(length)
        self.skip_batches = 0
        self.end_of_dataloader = False
        self.batches_yielded = 0
        self._epoch = 0
        for loader in loaders:  # each reads its whole pass; this one stops the epoch
            loader.limit = None
            loader.gradient_state = None

    @property
    def iterables(self) -> Any:
        """The prepared loaders in the structure they were given in."""
        return unflatten(self.loaders, self._spec)

    @property
    def flattened(self) -> list[Any]:
        """The prepared loaders as a flat list."""
        return list(self.loaders)

    def __getitem__(self, key: Any) -> Any:
        """``iterables[key]``: ``trainer.train_dataloader["labeled"]`` as in Lightning, whose
        ``train_dataloader`` is the structure of loaders."""
        return self.iterables[key]

    def __len__(self) -> int:
        length = self.limit
        if length is None:
            raise TypeError("the combined train loader has no length: a loader in it has none")
        return max(length - self.skip_batches, 0)

    def set_epoch(self, epoch: int) -> None:
        """Each loader's epoch (its shuffle order, with a seed); see `DataLoaderShard.set_epoch`."""
        self._epoch = epoch
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def end_workers(self) -> None:
        """End every loader's persistent workers (`DataLoaderShard.end_workers`)."""
        for loader in self.loaders:
            loader.end_workers()

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the mode and each loader's state (its seed and epoch; positions are the
        Trainer's, as for one loader)."""
        children = [
            {key: value for key, value in loader.state_dict().items() if key != "loader"}
            for loader in self.loaders
        ]
        return {"epoch": self._epoch, "combined": {"mode": self.mode, "loaders": children}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s.

        Raises:
            CheckpointError: the checkpoint's train loaders are not these (another count or mode).
        """
        combined = state.get("combined")
        saved = combined.get("loaders") if isinstance(combined, dict) else None
        mode = combined.get("mode") if isinstance(combined, dict) else None
        if not isinstance(saved, list) or len(saved) != len(self.loaders) or mode != self.mode:
            raise CheckpointError(
                f"the checkpoint's train loader state is not for {len(self.loaders)} train "
                f"loaders read in mode {self.mode!r} (saved: {describe(combined)}). Resume with "
                "the train loaders the checkpoint was saved with."
            )
        for loader, loader_state in zip(self.loaders, saved, strict=True):
            loader.load_state_dict(loader_state)
        self._epoch = state.get("epoch", self._epoch)

    def __iter__(self) -> Iterator[Any]:
        """One epoch: the combined batches after ``skip_batches``, up to the combined length."""
        skip, self.skip_batches = self.skip_batches, 0
        self.end_of_dataloader = False
        self.batches_yielded = 0
        consumed = [False] * len(self.loaders)
        for i, loader in enumerate(self.loaders):
            passes, position = self._position(loader, skip)
            consumed[i] = passes > 0
            loader.set_epoch(self._epoch + passes)  # a finished pass counts one epoch
            loader.skip_batches = position
        restart = [loader.__iter__ for loader in self.loaders]
        batches = read_together(restart, self.mode, consumed)
        left = math.inf if self.limit is None else self.limit - skip
        state = self.gradient_state
        is_reading = False
        try:
            current = next(batches, _END) if left > 0 else _END
            is_reading = True
            while current is not _END:
                has_more = self.batches_yielded + 1 < left
                following = next(batches, _END) if has_more else _END
                is_last = following is _END
                self.end_of_dataloader = is_last
                if state is not None:
                    active = state.active_dataloaders
                    if active and active[-1] is self:
                        state.end_of_dataloader = is_last
                    else:
                        state.begin_batch(self, is_last)
                batch = unflatten(current, self._spec)
                if self.transform is not None:
                    batch = self.transform(batch)
                self.batches_yielded += 1
                yield batch
                current = following
            self._epoch += 1
        finally:
            batches.close()  # closes the loaders' passes (their workers, their draws)
            if is_reading and state is not None:
                state.end_iteration(self)

    def _position(self, loader: Any, skip: int) -> tuple[int, int]:
        """(finished passes, batches into the open pass) of ``loader`` at combined batch ``skip``."""
        if not skip:
            return 0, 0
        length = _length(loader)
        if self.mode == "max_size_cycle" and not math.isinf(length) and length > 0:
            return divmod(skip, int(length))
        return 0, skip

    def __repr__(self) -> str:
        return f"PreparedCombinedLoader({self.iterables!r}, mode={self.mode!r})"


def iterables_of(source: Iterable[Any] | Any) -> tuple[list[Any], Any, str] | None:
    """``(loaders, spec, mode)`` when ``source`` is several train loaders (a CombinedLoader, or
    a dict / list / tuple, read in "max_size_cycle" as Lightning reads them); else None."""
    if isinstance(source, CombinedLoader):
        return source.flattened, source._spec, source.mode  # noqa: SLF001 - same module
    if isinstance(source, dict | list | tuple) and not hasattr(source, "_fields"):
        leaves, spec = flatten(source)
        return leaves, spec, "max_size_cycle"
    return None
