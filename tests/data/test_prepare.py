"""A prepared loader is a DataLoader to ``isinstance``, and is never prepared (sharded) twice."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer


class _Regression(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(10.0).unsqueeze(1)), batch_size=3)


def test_a_prepared_loader_is_a_dataloader_with_the_wrapped_loader_s_settings():
    # Failed before: not a DataLoader subclass, so `isinstance(loader, DataLoader)` was False.
    user = _loader()
    prepared = trainer.Accelerator(cpu=True).prepare(user)
    assert isinstance(prepared, DataLoader)
    assert (prepared.batch_size, prepared.dataset, prepared.num_workers) == (3, user.dataset, 0)
    assert [len(x) for (x,) in prepared] == [3, 3, 3, 1]


def test_a_prepared_loader_is_not_prepared_again():
    accelerator = trainer.Accelerator(cpu=True)
    prepared = accelerator.prepare(_loader())
    assert accelerator.prepare(prepared) is prepared
    for prepare in (accelerator.prepare_data_loader, trainer.prepare_data_loader):
        with pytest.raises(trainer.ConfigurationError, match="was prepared already"):
            prepare(prepared)
    fit = trainer.Trainer(max_epochs=1, logger=False, enable_checkpointing=False)
    with pytest.raises(trainer.ConfigurationError, match="was prepared already"):
        fit.fit(_Regression(), prepared)
