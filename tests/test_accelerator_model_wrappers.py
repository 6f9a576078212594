"""The prepared model's forward under mixed precision: autocast, and float32 outputs as Accelerate.

Accelerate's ``prepare_model`` wraps the forward in ``convert_outputs_to_fp32``: a loss computed
from the outputs outside ``accelerator.autocast()`` is computed in float32. The Trainer's
StepRouter keeps its step results as they are (Lightning does not convert them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from trainer import Accelerator
from trainer.accelerator.model_wrappers import AutocastForward
from trainer.precision import resolve_precision

_LOOP = """
import json, sys, torch
if sys.argv[1] == "accelerate":
    from accelerate import Accelerator
else:
    from trainer import Accelerator
accelerator = Accelerator(cpu=True, mixed_precision="bf16")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
net, optimizer = accelerator.prepare(net, optimizer)
generator = torch.Generator().manual_seed(1)
facts = {"dtypes": [], "losses": []}
for _ in range(4):
    x, y = torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    out = net(x)
    loss = torch.nn.functional.cross_entropy(out, y)  # outside accelerator.autocast()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    facts["dtypes"].append([str(out.dtype), str(loss.dtype)])
    facts["losses"].append(loss.item())
bare = accelerator.unwrap_model(net)
facts["kept"] = str(bare(torch.ones(2, 4)).dtype)  # keep_fp32_wrapper=True: still converted
facts["params"] = [p.detach().flatten().tolist() for p in bare.parameters()]
print(json.dumps(facts))
"""


def _run(framework: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", _LOOP, framework],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bf16_outputs_are_float32_and_training_matches_accelerate():
    # Failed before: the outputs were bfloat16, so cross_entropy ran in bfloat16 and the losses
    # and parameters differed from Accelerate's.
    pytest.importorskip("accelerate")
    expected, received = _run("accelerate"), _run("trainer")
    assert received["dtypes"] == expected["dtypes"] == [["torch.float32"] * 2] * 4
    assert received["kept"] == expected["kept"] == "torch.float32"
    assert received["losses"] == pytest.approx(expected["losses"], rel=1e-6)
    for mine, theirs in zip(received["params"], expected["params"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-7)


def test_keep_fp32_wrapper_false_takes_autocast_and_conversion_off():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    net = accelerator.prepare(torch.nn.Linear(4, 2))
    x = torch.ones(3, 4)
    assert net(x).dtype == torch.float32
    with accelerator.autocast():
        assert net.forward.original(x).dtype == torch.bfloat16  # what autocast computes
    bare = accelerator.unwrap_model(net, keep_fp32_wrapper=False)
    assert not isinstance(bare.forward, AutocastForward)
    assert bare(x).dtype == torch.float32  # float32 weights, no autocast


class _Router(torch.nn.Module):
    """Stands for the Trainer's StepRouter: its forward returns a step's result."""

    routes_steps_to_module = True

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.module(x).sum(), "out": self.module(x)}


class _EngineWrapper(torch.nn.Module):
    """Keeps the model as ``.module``, as DDP and DeepSpeed's engine do."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


@pytest.mark.parametrize("wrap", [lambda m: m, _EngineWrapper], ids=["router", "engine_wrapped"])
def test_the_trainers_step_router_keeps_its_step_results_as_they_are(wrap):
    precision = resolve_precision("bf16-mixed")
    model = wrap(_Router())
    result = AutocastForward(model.forward, precision)(torch.ones(3, 4))
    assert result["out"].dtype == torch.bfloat16  # Lightning's bf16-mixed: left in bfloat16
    plain = torch.nn.Linear(4, 2)
    converted = AutocastForward(plain.forward, precision)(torch.ones(3, 4))
    assert converted.dtype == torch.float32
