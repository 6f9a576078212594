"""The data pipelines of the exact-resume tests: datasets that augment with torch, numpy and random.

Shared by tests/test_exact_resume_data.py (one process) and tests/distributed/resume_data_worker.py
(2 processes). ``run(...)`` trains a small model on one of them and returns, per global step, the
batch that step saw, with the final weights: an interrupted-and-resumed run must return the same.
"""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import trainer
from trainer.callbacks import Callback, ModelCheckpoint

SAMPLES = 40
FEATURES = 4


def _clean(index: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + index)
    return torch.randn(FEATURES, generator=generator)


def _noise() -> torch.Tensor:
    """One augmentation drawing from each global generator: torch, numpy, Python random."""
    return (
        0.1 * torch.randn(FEATURES)
        + torch.from_numpy(0.1 * np.random.randn(FEATURES)).float()
        + 0.1 * random.random()
    )


class Counter:
    """Counts samples produced in every process (workers included): shared memory and a lock.

    The lock is made in the forkserver context, not the default (fork) one: a fork-context lock
    cannot be sent to a worker started by a forkserver ("A SemLock created in a fork context is
    being shared with a process in a spawn context"), while this one also works in forked workers
    (they inherit it), so the same datasets serve loaders with either start method.
    """

    def __init__(self) -> None:
        self._value = multiprocessing.get_context("forkserver").Value("q", 0)

    def add(self) -> None:
        with self._value.get_lock():
            self._value.value += 1

    @property
    def value(self) -> int:
        return self._value.value


class NoisyMap(Dataset):
    """Map-style: sample ``i`` plus fresh noise at every read; ``produced`` counts reads."""

    def __init__(self) -> None:
        self.produced = Counter()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.produced.add()
        x = _clean(index) + _noise()
        return x, x.mean(0, keepdim=True)


class NoisyStream(IterableDataset):
    """Iterable, split among workers: a random few samples are dropped, the rest get noise."""

    def __init__(self) -> None:
        self.produced = Counter()

    def _indices(self) -> range:
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return range(first, SAMPLES, step)

    def _sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if random.random() < 0.1:  # the stream itself is random, not only its values
            return None
        self.produced.add()
        x = _clean(index) + _noise()
        return x, x.mean(0, keepdim=True)

    def __iter__(self):
        for index in self._indices():
            sample = self._sample(index)
            if sample is not None:
                yield sample


class ResumableStream(NoisyStream):
    """A NoisyStream that can say where it stands (torchdata's Stateful protocol), so a
    StatefulDataLoader restores it instead of reading it again up to the resume point."""

    def __init__(self) -> None:
        super().__init__()
        self.position = 0

    def __iter__(self):
        indices, start, self.position = self._indices(), self.position, 0
        for offset, index in enumerate(indices):
            if offset < start:
                continue
            self.position = offset + 1
            sample = self._sample(index)
            if sample is not None:
                yield sample
        self.position = 0  # the next pass is a new epoch

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class Net(trainer.TrainModule):
    """Linear regression with momentum; records the batch of each global step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        self.seen: dict[int, torch.Tensor] = {}

    def training_step(self, batch, batch_idx):
        if isinstance(batch, dict):  # several train loaders read together: one batch of each
            x, y = (torch.cat(parts) for parts in zip(*batch.values(), strict=True))
        else:
            x, y = batch
        self.seen[self.global_step + 1] = x.detach().clone()
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)


class StopAt(Callback):
    """Stops fit after optimizer step ``step`` (as a crash would, minus the crash)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


def make_loader(
    kind: str,
    *,
    num_workers: int = 0,
    persistent_workers: bool = False,
    batch_size: int = 4,
    stateful: bool = False,
    multiprocessing_context: str | None = None,
) -> DataLoader:
    """A loader over "map" (shuffled), "stream" or "resumable" data; torchdata's with ``stateful``.

    ``multiprocessing_context`` starts the workers ("forkserver" in a multi-process job: see
    tests/distributed/resume_data_worker.py); default: the platform's (fork on Linux).
    """
    dataset = {"map": NoisyMap, "stream": NoisyStream, "resumable": ResumableStream}[kind]()
    loader_class = DataLoader
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as loader_class
    return loader_class(
        dataset,
        batch_size=batch_size,
        shuffle=kind == "map",
        num_workers=num_workers,
        persistent_workers=persistent_workers and num_workers > 0,
        multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
    )


def run(
    root: Path,
    loader: DataLoader | Any,
    *,
    max_epochs: int = 3,
    stop_at: int | None = None,
    ckpt_path: str | None = None,
    seed: int | None = 7,
    **trainer_options: Any,
) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """Fit ``Net`` on ``loader``; return (batch per global step, final weights).

    Checkpoints every 5 steps into ``root/checkpoints`` (``last`` kept); ``stop_at`` stops early.
    """
    torch.manual_seed(0)
    module = Net()
    callbacks: list[Callback] = [
        ModelCheckpoint(
            dirpath=root / "checkpoints", every_n_train_steps=5, save_top_k=-1, save_last=True
        )
    ]
    if stop_at is not None:
        callbacks.append(StopAt(stop_at))
    options = dict(
        max_epochs=max_epochs, seed=seed, accelerator="cpu", default_root_dir=str(root),
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        num_sanity_val_steps=0, callbacks=callbacks,
    )  # fmt: skip
    options.update(trainer_options)
    fit = trainer.Trainer(**options)
    fit.fit(module, loader, ckpt_path=ckpt_path)
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return module.seen, weights


def differing_steps(full: dict[int, torch.Tensor], resumed: dict[int, torch.Tensor]) -> list[int]:
    """The resumed steps whose batch differs (bit for bit) from the uninterrupted run's, or that
    the uninterrupted run never took; and the uninterrupted run's steps the resumed one missed."""
    differ = [s for s, x in resumed.items() if s not in full or not torch.equal(full[s], x)]
    first = min(resumed, default=0)
    return differ + [s for s in full if s >= first and s not in resumed]


def differing_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [name for name in a if not torch.equal(a[name], b[name])]
