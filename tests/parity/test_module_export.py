"""Parity by difference: ``to_torchscript`` and ``to_onnx`` on lightning.pytorch 2.6 and trainer.

The same module (seeded; a linear stack, and one with BatchNorm and dropout) is exported by both
frameworks, and the exported models are run on the same input: TorchScript modules by torch,
ONNX models by onnx's reference evaluator. Lightning's output is the expected value.

One difference is pinned: Lightning's ``to_onnx`` exports the module in the mode it is in, so a
module in train mode (as after ``fit``) gets an ONNX graph with batch statistics and dropout,
which does not compute what the module computes in eval mode; ours exports in eval mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.frameworks import BOTH, Framework

pytestmark = pytest.mark.filterwarnings("ignore")


def _module(framework: Framework, *, batch_norm: bool) -> Any:
    class Exported(framework.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            middle = [torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5)] if batch_norm else []
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 8), *middle, torch.nn.ReLU(), torch.nn.Linear(8, 2)
            )
            self.example_input_array = torch.randn(3, 4)
            if batch_norm:
                with torch.no_grad():
                    self.net[1].running_mean.fill_(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    return Exported()


def _onnx_output(path: Path, x: torch.Tensor) -> torch.Tensor:
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    (out,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.numpy()})
    return torch.from_numpy(out)


@pytest.mark.parametrize("method", ["script", "trace"])
def test_torchscript_modules_compute_what_lightnings_do(tmp_path, method):
    x = torch.randn(5, 4)
    outputs = []
    for framework in BOTH:
        module = _module(framework, batch_norm=True)
        compiled = module.to_torchscript(tmp_path / f"{framework.name}.pt", method=method)
        outputs.append((compiled(x), torch.jit.load(str(tmp_path / f"{framework.name}.pt"))(x)))
        assert module.training  # both put the mode back
    (lightning, lightning_loaded), (ours, ours_loaded) = outputs
    torch.testing.assert_close(ours, lightning)
    torch.testing.assert_close(ours_loaded, lightning_loaded)


def test_onnx_models_compute_what_lightnings_do(tmp_path):
    pytest.importorskip("onnxscript")
    x = torch.randn(3, 4)
    lightning, ours = (_onnx_output(_export(fw, tmp_path, batch_norm=False), x) for fw in BOTH)
    torch.testing.assert_close(ours, lightning)


def test_onnx_of_a_module_in_train_mode_is_its_eval_graph_where_lightnings_is_not(tmp_path):
    pytest.importorskip("onnxscript")
    x = torch.randn(3, 4)
    eval_output = _module(BOTH[1], batch_norm=True).eval()(x).detach()
    lightning, ours = (_onnx_output(_export(fw, tmp_path, batch_norm=True), x) for fw in BOTH)
    torch.testing.assert_close(ours, eval_output)
    assert (lightning - eval_output).abs().max() > 0.1  # batch statistics and dropout


def _export(framework: Framework, tmp_path: Path, *, batch_norm: bool) -> Path:
    path = tmp_path / framework.name / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    _module(framework, batch_norm=batch_norm).to_onnx(path)
    return path
