"""The batch DeepSpeed's engine sees in bf16: floating inputs cast to the engine's dtype.

On a GPU DeepSpeed switches torch's autocast off inside its forward, so a float batch met the
engine's bf16 weights ("mat1 and mat2 must have the same dtype", found on an H200). The step
below switches autocast off itself, so the CPU shows the same thing. Each fit runs in a
subprocess: DeepSpeed's one-process group and its LOCAL_RANK would outlive it in this one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="pip install 'trainer[deepspeed]'"
)

FIT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import trainer
    from trainer.strategies import DeepSpeedStrategy

    class NoAutocastNet(trainer.TrainModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            x, ids = batch
            self.seen.append([str(x.dtype), str(ids.dtype)])
            with torch.autocast("cpu", enabled=False):  # as DeepSpeed's engine does on a GPU
                out = self.net(x)
            return out.float().pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    module = NoAutocastNet()
    run = trainer.Trainer(
        strategy=DeepSpeedStrategy(accelerator=device), precision=sys.argv[1], max_steps=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=sys.argv[2],
    )
    run.fit(module, DataLoader(TensorDataset(torch.randn(8, 4), torch.arange(8)), batch_size=4))
    print("SEEN", json.dumps(module.seen))
    """
)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_float_inputs_reach_the_step_in_the_engines_dtype_and_integers_stay(tmp_path, precision):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", FIT, precision, str(tmp_path)],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.split("SEEN ", 1)[1])
    expected = "torch.bfloat16" if precision == "bf16-mixed" else "torch.float32"
    assert seen == [[expected, "torch.int64"]] * 2


def test_the_cpu_is_refused_when_deepspeed_was_imported_for_cuda_first(tmp_path):
    # DeepSpeed fixes its accelerator at import; found on an H200, where an earlier import chose
    # CUDA and a DeepSpeedStrategy("cpu") then trained on the GPU. DS_ACCELERATOR=cuda makes that
    # choice on a CPU machine too.
    code = textwrap.dedent(
        """
        import deepspeed
        from trainer.errors import StrategyError
        from trainer.strategies.deepspeed_engine import import_deepspeed
        try:
            import_deepspeed("cpu")
        except StrategyError as err:
            print("REFUSED", err)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cuda"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REFUSED DeepSpeedStrategy(accelerator='cpu')" in result.stdout, result.stdout
    assert "chose its 'cuda' accelerator" in result.stdout
