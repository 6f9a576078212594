"""Rank 1 raises at step 3 of a DDP fit; the whole job must end promptly with its traceback."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from tests.distributed.ddp_worker import Net, quiet, regression


class Faulty(Net):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and self.global_step == 3:
            raise RuntimeError("injected failure on rank 1 at step 3")
        return super().training_step(batch, batch_idx)


if __name__ == "__main__":
    torch.manual_seed(0)
    quiet(max_epochs=50).fit(Faulty(), DataLoader(regression(256), batch_size=4))
