"""One module's weight average: an ``AveragedModel`` of its tensors, and the moves made with it.

This module owns the ``torch.optim.swa_utils.AveragedModel`` the averaging callbacks keep:
folding the module's weights in, swapping the average into the module and back, copying it in,
and the averaged (or training) tensors by the module's names, tied names included, to save and
restore it. It does not decide when any of this happens (``weight_averaging.py``).

The ``AveragedModel`` wraps a mirror of the module's tensors, not the TrainModule: it deep-copies
what it averages, and a TrainModule refers to its Trainer (loaders, loggers), never to be copied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.optim.swa_utils import AveragedModel

from trainer.errors import CheckpointError

__all__ = ["AvgFn", "ModuleAverage"]

AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | int], torch.Tensor]


class _TensorMirror(torch.nn.Module):
    """The module's parameters and buffers, in its own order, without its code or its Trainer."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        # Aliases of the module's storage: AveragedModel deep-copies this mirror, so only the
        # tensors are copied, once.
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter(p.detach(), requires_grad=False) for p in module.parameters()
        )
        for index, buffer in enumerate(module.buffers()):
            self.register_buffer(f"buffer_{index}", buffer.detach())


class ModuleAverage:
    """An ``AveragedModel`` of one module's tensors, and the moves the callbacks make with it."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        device: torch.device | str | None,
        use_buffers: bool,
        avg_fn: AvgFn | None = None,
        multi_avg_fn: Callable[..., None] | None = None,
    ) -> None:
        self.module = module
        self.use_buffers = use_buffers
        self.model = AveragedModel(
            _TensorMirror(module),
            device=device,
            avg_fn=avg_fn,
            multi_avg_fn=multi_avg_fn,
            use_buffers=use_buffers,
        )
        self.is_swapped = False  # True: the module holds the average, the mirror the weights
        self._index = _name_index(module, with_buffers=use_buffers)
        self._num_params = len(self.model.module.params)

    def _values(self, source: torch.nn.Module) -> list[torch.Tensor]:
        """The averaged tensors of ``source`` (the mirror or the module), in mirror order."""
        return [*source.parameters(), *(source.buffers() if self.use_buffers else ())]

    @property
    def n_averaged(self) -> int:
        """How many snapshots of the module's weights the average holds."""
        return int(self.model.n_averaged.item())

    def update(self) -> None:
        """Fold the module's current weights into the average."""
        self.model.update_parameters(self.module)

    def _pairs(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return zip(self._values(self.model.module), self._values(self.module), strict=True)

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the averaged and the module's values in place; twice restores both."""
        for averaged, current in self._pairs():
            held = current.detach().clone()
            current.detach().copy_(averaged.detach())
            averaged.detach().copy_(held)
        self.is_swapped = not self.is_swapped

    @torch.no_grad()
    def copy_to_module(self) -> None:
        """Put the average into the module (the mirror keeps it too)."""
        for averaged, current in self._pairs():
            current.detach().copy_(averaged.detach())

    def tensors(self, *, averaged: bool) -> dict[str, torch.Tensor]:
        """The averaged (or the training) values by the module's names, tied names included."""
        mirror_holds_average = not self.is_swapped
        source = self.model.module if averaged == mirror_holds_average else self.module
        values = self._values(source)
        return {name: values[index].detach() for name, index in self._index.items()}

    @torch.no_grad()
    def load_averaged(self, tensors: dict[str, torch.Tensor], n_averaged: int) -> None:
        """Put a saved average back; a buffer it lacks (non-persistent) keeps its value."""
        values = self._values(self.model.module)
        covered = {index for name, index in self._index.items() if name in tensors}
        missing = [n for n, i in self._index.items() if i not in covered and i < self._num_params]
        if missing:
            raise CheckpointError(
                f"the checkpoint's weight average lacks {missing[:5]}: it was saved for another "
                "model. Resume with the same module, or without the averaging callback."
            )
        for name, index in self._index.items():
            if name in tensors:
                values[index].copy_(tensors[name])
        self.model.n_averaged.fill_(n_averaged)


def _name_index(module: torch.nn.Module, *, with_buffers: bool) -> dict[str, int]:
    """Every name of every tensor (tied weights have several) -> its position in the mirror."""
    params = list(module.parameters())
    position = {id(p): i for i, p in enumerate(params)}
    index = {name: position[id(p)] for name, p in module.named_parameters(remove_duplicate=False)}
    if with_buffers:
        buffers = list(module.buffers())
        position = {id(b): len(params) + i for i, b in enumerate(buffers)}
        index.update(
            (name, position[id(b)])
            for name, b in module.named_buffers(remove_duplicate=False)
            if id(b) in position
        )
    return index
