"""GradientState: one Accelerator's accumulation bookkeeping (not shared between Accelerators)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GradientState"]


@dataclass
class GradientState:
    """Whether this batch synchronises gradients and steps, and where the dataloader is.

    ``step`` counts batches inside the accumulation window; ``end_of_dataloader`` is set by the
    prepared dataloader while its last batch is in use; ``active_dataloader`` is the prepared
    dataloader being iterated (Accelerate's name).
    """

    num_steps: int = 1
    adjust_scheduler: bool = False  # Accelerate 1.15's reads False whatever the plugin says
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    sync_gradients: bool = True
    step: int = 0
    end_of_dataloader: bool = False
    remainder: int = -1
    active_dataloaders: list[Any] = field(default_factory=list)

    def begin_batch(self, dataloader: Any, is_last: bool) -> None:
        """Called by a prepared dataloader before it yields each batch."""
        active = self.active_dataloaders
        if not active or active[-1] is not dataloader:
            active.append(dataloader)
            self.remainder = dataloader.remainder
        self.end_of_dataloader = is_last

    def end_iteration(self, dataloader: Any) -> None:
        """Called by a prepared dataloader when its iteration ends (exhausted or abandoned)."""
        active = self.active_dataloaders
        if dataloader in active:
            active.remove(dataloader)
        # Back in an outer loader (an evaluation run inside a training batch): its state again,
        # so its last batch still ends the accumulation window (Accelerate's).
        outer = active[-1] if active else None
        self.end_of_dataloader = bool(getattr(outer, "end_of_dataloader", False))
        self.remainder = outer.remainder if outer is not None else -1

    def advance(self) -> bool:
        """Count one batch; decide and return whether it synchronises (and steps)."""
        self.step += 1
        if self.sync_with_dataloader and self.end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
        else:
            self.sync_gradients = self.step % self.num_steps == 0
        return self.sync_gradients

    def start_window(self, position: int = 0) -> None:
        """Count windows afresh, ``position`` batches in: a fit's epoch starts its own windows
        (Lightning's count the epoch's batches), also after one that ended inside a window."""
        self.step = position % self.num_steps

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated."""
        return bool(self.active_dataloaders)

    @property
    def active_dataloader(self) -> Any:
        """The prepared dataloader being iterated (the innermost one), None outside any."""
        return self.active_dataloaders[-1] if self.active_dataloaders else None
