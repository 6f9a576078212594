"""The batch DeepSpeed's engine sees in bf16: floating inputs cast to the engine's dtype.

On a GPU DeepSpeed switches torch's autocast off inside its forward, so a float batch met the
engine's bf16 weights ("mat1 and mat2 must have the same dtype", found on an H200). The step
below switches autocast off itself, so the CPU shows the same thing.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.strategies import DeepSpeedStrategy

pytest.importorskip("deepspeed")


class NoAutocastNet(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen: list[tuple[torch.dtype, torch.dtype]] = []

    def training_step(self, batch, batch_idx):
        x, ids = batch
        self.seen.append((x.dtype, ids.dtype))
        with torch.autocast("cpu", enabled=False):  # as DeepSpeed's engine does on a GPU
            out = self.net(x)
        return out.float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_float_inputs_reach_the_step_in_the_engines_dtype_and_integers_stay(tmp_path, precision):
    data = TensorDataset(torch.randn(8, 4), torch.arange(8))
    module = NoAutocastNet()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    run = trainer.Trainer(
        strategy=DeepSpeedStrategy(accelerator=device), precision=precision, max_steps=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path),
    )  # fmt: skip
    run.fit(module, DataLoader(data, batch_size=4))
    expected = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    assert module.seen == [(expected, torch.int64)] * 2
